"""The registry's names on one line, for shell scripts: scripts/table1.sh trains
`python -m deepnet_methods list --field family --zoo`; scripts/train_setup.sh --help lists `list --zoo --sep ', '`;
docs/results/schemes/commands.sh studies `list --zoo --since 2024`."""

import argparse
import sys

from . import METHODS, SIZES, label, names, resolve

FIELDS = ("name", "family", "arch", "label")


def field(name, which, size):
    """One field of a method or init variant (a variant's family and arch: its method's)."""
    method, _ = resolve(name)
    return {"name": name, "family": method.family, "arch": method.arch(size), "label": label(name)}[which]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m deepnet_methods", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    paper = ", ".join(names(zoo=False))
    listing = commands.add_parser("list", help="the methods in table order, one field each, on one line",
                                  description="The methods in table order (DeepNet's Table 1), one field of each, "
                                              f"joined by --sep. Default: the paper's three, {paper}.")
    listing.add_argument("--field", choices=FIELDS, default="name",
                         help="name: the setups' --arch; family: the plugin's fairseq model; arch: the fairseq --arch "
                              "at --size; label: the tables' (default: %(default)s)")
    listing.add_argument("--zoo", action="store_true", help=f"every method: also the Table 1 baselines "
                         f"({', '.join(m.name for m in METHODS.values() if m.zoo)})")
    listing.add_argument("--variants", action="store_true", help="each method's named init variants after it")
    listing.add_argument("--size", default="", choices=SIZES,
                         help="the size variant of --field arch (default: none)")
    listing.add_argument("--since", type=int, default=0, metavar="YEAR",
                         help="only the methods published in YEAR or later (with --zoo: the newest schemes)")
    listing.add_argument("--sep", default=",", help="between the names (default: %(default)r)")
    args = parser.parse_args(argv)
    chosen = [name for name in names(args.zoo, args.variants) if resolve(name)[0].year >= args.since]
    print(args.sep.join(field(name, args.field, args.size) for name in chosen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
