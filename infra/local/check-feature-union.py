#!/usr/bin/env python3
"""Fails when the functions' own build would turn on other features than the tests' build.

`cargo lambda build` of the four functions (infra/deploy/build.sh, and each alone in `cdk synth`)
resolves features over those crates only; `cargo test --workspace` over every crate and its
dev-dependencies. Where a dependency's features differ, cargo builds it, and everything above it,
twice: the AWS SDK was compiled once for the bootstraps and again for the tests. The crate
workspace-hack/ asks for the union; this check names what it misses, as lines to add to it.

Usage: check-feature-union.py (from the workspace root; cargo on PATH).
"""
import os
import subprocess
import sys

FUNCTIONS = ["gridrelay-ingest", "gridrelay-deliver", "gridrelay-dead-letter", "gridrelay-portal"]


def features(packages, edges):
    """{(crate, version): set of features} in the build of `packages` ("--workspace" for all)."""
    args = ["cargo", "tree", "--locked", "--prefix", "none", "-f", "{p} {f}", "-e", edges]
    args += ["--workspace"] if packages is None else [a for p in packages for a in ("-p", p)]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        parts = line.replace(" (*)", "").split()
        if len(parts) < 2 or not parts[1].startswith("v"):
            continue
        named = set(parts[2].split(",")) if len(parts) > 2 and not parts[2].startswith("(") else set()
        found.setdefault((parts[0], parts[1]), set()).update(named)
    return found


def differences(side, edges_all, edges_functions):
    everything = features(None, edges_all)
    functions = features(FUNCTIONS, edges_functions)
    missing = []
    for key, named in sorted(functions.items()):
        extra = everything.get(key, named) - named
        if extra:
            missing.append(f"  {side}: {key[0]} {key[1]}: {', '.join(sorted(extra))}")
    return missing


def main():
    # The target's side (what runs) and the host's (build scripts and procedural macros, whose
    # features unify apart): cargo tree shows the host's crates where build and proc-macro
    # edges are followed.
    missing = differences("target", "normal,dev,no-proc-macro", "normal,no-proc-macro")
    missing += differences("with the host's (build-dependencies)", "all", "normal,build")
    if missing:
        print(
            "the tests' build turns on features the functions' build does not, so cargo would "
            "build these crates and everything above them twice; add them to "
            "workspace-hack/Cargo.toml:",
            file=sys.stderr,
        )
        print("\n".join(missing), file=sys.stderr)
        return 1
    print("one set of features for the functions and the tests", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("CARGO_TERM_COLOR", "never")
    sys.exit(main())
