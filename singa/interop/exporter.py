"""singa-export onnx|caffe JOB.conf SNAPSHOT -o OUT: a job's test net with a snapshot's values
as an ONNX model or a Caffe deploy net + weights."""
import os
import sys

from singa.errors import ArgumentParser, ConfigError, SingaError
from singa.interop import deploy

__all__ = ["main"]

#: the largest -batch: Caffe counts a blob's items in an int
MAX_BATCH = 2**31 - 1


def main(argv=None):
    ap = ArgumentParser(
        prog="singa-export", description="Export a job's test net with a snapshot's values.")
    ap.add_argument("format", choices=["onnx", "caffe"])
    ap.add_argument("conf", metavar="JOB.conf")
    ap.add_argument("snapshot", metavar="SNAPSHOT",
                    help="a snapshot file, a checkpoint folder or workspace (its newest complete "
                         "snapshot, as -resume finds it), or <checkpoint folder>/step<N>")
    ap.add_argument("-o", dest="out", required=True,
                    help="onnx: the .onnx file; caffe: a folder for deploy.prototxt and "
                         "model.caffemodel")
    ap.add_argument("-batch", type=int,
                    help="the inputs' batch size (default: onnx symbolic N; caffe the conf's)")
    try:
        args = ap.parse_args(argv)
        if not os.path.isfile(args.conf):
            raise ConfigError(f"{args.conf}: no such job conf")
        if args.batch is not None and not 1 <= args.batch <= MAX_BATCH:
            raise ConfigError(f"-batch {args.batch}: must be 1 to {MAX_BATCH}")
        target = "ONNX" if args.format == "onnx" else "Caffe"
        model = deploy.read(args.conf, args.snapshot, target)
        if args.format == "onnx":
            from singa.interop import onnx
            onnx.write(model, args.out, args.batch)
            written = [args.out]
        else:
            from singa.interop.caffe import write as caffe
            written = caffe.write(model, args.out, args.batch)
    except SingaError as e:
        print(f"singa-export: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        print(f"singa-export: cannot write {e.filename or args.out}: {e.strerror}",
              file=sys.stderr)
        return 2
    print(f"{args.format}: {', '.join(written)} (step {model.step}; inputs "
          f"{', '.join(f'{op.name} {list(op.shape[1:])}' for op in model.inputs)}; outputs "
          f"{', '.join(model.outputs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
