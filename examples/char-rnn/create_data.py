"""Make char-rnn's input.txt and vocab.txt from a text every Debian has (SINGA's data.py).

    python examples/char-rnn/create_data.py [--text FILE] [--out-dir DIR] [--vocab-size N]

Copies --text (default /usr/share/common-licenses/GPL-3) to input.txt and writes its distinct
bytes, sorted, to vocab.txt (a character's index is its position there), into --out-dir
(default: beside this script). The confs one-hot encode --vocab-size (101) indices, so the text
may have at most that many distinct bytes. Prints the text's size, vocabulary and unigram
entropy in nats, the loss of a model that knows only character frequencies.
"""
import argparse
import math
import os
import sys

TEXT = "/usr/share/common-licenses/GPL-3"


def unigram_entropy(data):
    """−Σ_c p(c) ln p(c) over the bytes of `data`, in nats."""
    n = len(data)
    return -sum(k / n * math.log(k / n) for k in (data.count(bytes([c])) for c in set(data)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--text", default=TEXT, help=f"the training text (default {TEXT})")
    parser.add_argument("--out-dir", default=os.path.dirname(os.path.abspath(__file__)),
                        help="where input.txt and vocab.txt go (default: here)")
    parser.add_argument("--vocab-size", type=int, default=101,
                        help="most distinct bytes allowed (onehot_conf.vocab_size, 101)")
    args = parser.parse_args(argv)
    try:
        with open(args.text, "rb") as f:
            data = f.read()
        vocab = bytes(sorted(set(data)))
        if not data or len(vocab) > args.vocab_size:
            print(f"create_data: {args.text}: {len(vocab)} distinct bytes, the confs allow 1 to "
                  f"{args.vocab_size}", file=sys.stderr)
            return 2
        for name, content in (("input.txt", data), ("vocab.txt", vocab)):
            with open(os.path.join(args.out_dir, name), "wb") as f:
                f.write(content)
    except OSError as e:
        print(f"create_data: {e}", file=sys.stderr)
        return 2
    print(f"input.txt: {len(data)} characters from {args.text}; vocab.txt: {len(vocab)}; "
          f"unigram entropy {unigram_entropy(data):.4f} nats", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
