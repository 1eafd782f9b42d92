"""`ninfer convert SRC_DIR OUT.ninfer [--target ID] [--dtype bf16|fp32]`; `ninfer convert --list` prints
the identities a checkpoint can match (as `ninfer identities`)."""
from __future__ import annotations

import argparse
import sys
import time


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("src_dir", metavar="SRC_DIR", nargs="?", default=None, help="Hugging Face checkpoint directory")
    p.add_argument("out", metavar="OUT.ninfer", nargs="?", default=None, help="output artifact (written atomically)")
    p.add_argument("--list", action="store_true",
                   help="list the registered identities and their dimensions (as `ninfer identities`) and exit")
    p.add_argument("--target", metavar="ID", default=None,
                   help="expected identity (default: chosen by matching the config's dimension facts)")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default=None,
                   help="storage dtype (default: the identity's storage profile)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args: argparse.Namespace) -> int:
    from ninfer.artifact import ArtifactError, open_artifact
    from ninfer.gateway.cli.main import CLIError
    from ninfer.convert import ConvertError, convert

    if args.list:
        if args.src_dir is not None:
            raise CLIError("--list takes no SRC_DIR or OUT.ninfer")
        from ninfer.gateway.cli.cmd_identities import table
        print("\n".join(table()))
        return 0
    if args.src_dir is None or args.out is None:
        raise CLIError("convert needs SRC_DIR and OUT.ninfer (or --list)")
    t0 = time.perf_counter()
    try:
        out = convert(args.src_dir, args.out, target=args.target, dtype=args.dtype,
                      progress=not args.no_progress)
        with open_artifact(out) as art:
            n, size = len(art.tensor_names()), out.stat().st_size
            print(f"wrote {out}: {art.identity}, {art.dtype}, {n} tensors, groups {', '.join(art.groups)}, "
                  f"{size / 2**30:.2f} GiB in {time.perf_counter() - t0:.1f} s", file=sys.stdout)
    except (ConvertError, ArtifactError) as e:
        raise CLIError(str(e)) from None
    return 0
