"""Make rnnlm's word shards from the license texts every Debian has, like SINGA's create_data.cc.

    python examples/rnnlm/create_data.py [--texts DIR] [--out-dir DIR] [--class-size N]

Sentences of every text in --texts (default /usr/share/common-licenses, symlinks skipped),
lower-cased, split at . ; : ! ? and blank lines into words [a-z0-9]+('[a-z]+)?; every tenth
sentence goes to validation, the rest to training. As SINGA's tool does: the vocabulary comes
from the training words, "</s>" (index 0, ends each sentence) first, then by count (ties: first
seen); classes split the cumulative word frequency into --class-size (100) equal parts;
validation words unknown to the vocabulary are dropped. Writes train_data.bin and
valid_data.bin (kvfile, keys "%05d", values WordRecord of rnnlm.proto) into --out-dir (default:
beside this script) and prints the vocabulary size.
"""
import argparse
import collections
import os
import re
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
# Run from a checkout: use the singa package beside this script, not another installed one.
if os.path.isfile(os.path.join(_ROOT, "singa", "__init__.py")) and _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from singa.errors import DataError, SingaError  # noqa: E402
from singa.extensions import load_proto  # noqa: E402
from singa.io.kvfile import KVFile  # noqa: E402

TEXTS = "/usr/share/common-licenses"
EOS = "</s>"


def sentences(texts_dir):
    """Word lists of the sentences of every regular file in `texts_dir`, in name order."""
    names = sorted(n for n in os.listdir(texts_dir)
                   if not os.path.islink(os.path.join(texts_dir, n))
                   and os.path.isfile(os.path.join(texts_dir, n)))
    if not names:
        raise DataError(f"{texts_dir}: no text files")
    out = []
    for name in names:
        with open(os.path.join(texts_dir, name), encoding="utf-8", errors="replace") as f:
            text = f.read().lower()
        for s in re.split(r"[.;:!?]\s|\n\s*\n", text):
            words = re.findall(r"[a-z0-9]+(?:'[a-z]+)?", s)
            if words:
                out.append(words)
    return out


def vocabulary(train, class_size):
    """{word: (index, class)} and per class [start, end) of the word indices, as create_data.cc
    (its `old_classes` rule)."""
    counts = collections.Counter(w for s in train for w in s + [EOS])
    words = [EOS] + sorted((w for w in counts if w != EOS), key=lambda w: -counts[w])
    total = sum(counts.values())
    vocab, df, a = {}, 0.0, 0
    for i, w in enumerate(words):
        df = min(df + counts[w] / total, 1.0)
        vocab[w] = (i, a)
        if df > (a + 1) / class_size and a < class_size - 1:
            a += 1
    bounds = {}
    for i, c in vocab.values():
        start, end = bounds.get(c, (i, i + 1))
        bounds[c] = (min(start, i), max(end, i + 1))
    return vocab, bounds


def write_shard(path, sents, vocab, bounds, word_record):
    """kvfile `path` of one WordRecord per known word, "</s>" after each sentence; written under
    a temporary name and renamed."""
    tmp = f"{path}.tmp{os.getpid()}"
    n = 0
    try:
        with KVFile(tmp, "create") as f:
            for s in sents:
                for w in s + [EOS]:
                    if w not in vocab:
                        continue
                    i, c = vocab[w]
                    rec = word_record(word=w, word_index=i, class_index=c,
                                      class_start=bounds[c][0], class_end=bounds[c][1])
                    f.insert(b"%05d" % n, rec.SerializeToString())
                    n += 1
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return n


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", default=TEXTS, help=f"folder of texts (default {TEXTS})")
    parser.add_argument("--out-dir", default=_HERE, help="where the shards go (default: here)")
    parser.add_argument("--class-size", type=int, default=100, help="word classes (100)")
    args = parser.parse_args(argv)
    try:
        if args.class_size <= 0:
            raise DataError(f"--class-size {args.class_size} must be positive")
        sents = sentences(args.texts)
        train = [s for i, s in enumerate(sents) if i % 10 != 9]
        valid = [s for i, s in enumerate(sents) if i % 10 == 9]
        vocab, bounds = vocabulary(train, args.class_size)
        word_record = load_proto(os.path.join(_HERE, "rnnlm.proto")).WordRecord
        for name, part in (("train_data.bin", train), ("valid_data.bin", valid)):
            n = write_shard(os.path.join(args.out_dir, name), part, vocab, bounds, word_record)
            print(f"{name}: {n} words", file=sys.stderr)
        print(f"vocabulary: {len(vocab)} words in {len(bounds)} classes", file=sys.stderr)
    except (SingaError, OSError) as e:
        print(f"create_data: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
