"""Print the third-party requirements of local distributions, one per line, for pip -r.

    python requirements.py PYPROJECT [PYPROJECT ...] [--extra NAME ...]

The image builds install these in a layer of their own, before the source is copied, so a code
change rebuilds only the last, small layer. Requirements on one of the given distributions
themselves (the agent needs the plugin, which is not on PyPI) are left out: they are installed
from the source afterwards.
"""

import argparse
import re
import tomllib


def name_of(requirement: str) -> str:
    """`livekit-agents[silero]==1.8.9` -> `livekit-agents`, normalized as PyPI does."""
    name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)
    return re.sub(r"[-_.]+", "-", name).lower()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pyprojects", nargs="+")
    parser.add_argument("--extra", action="append", default=[], help="an optional-dependencies group")
    args = parser.parse_args()
    projects = []
    for path in args.pyprojects:
        with open(path, "rb") as f:
            projects.append(tomllib.load(f)["project"])
    local = {name_of(p["name"]) for p in projects}
    unknown = set(args.extra) - {e for p in projects for e in p.get("optional-dependencies", {})}
    if unknown:
        raise SystemExit(f"no such extra in {', '.join(args.pyprojects)}: {', '.join(sorted(unknown))}")
    for project in projects:
        extras = project.get("optional-dependencies", {})
        for requirement in project.get("dependencies", []) + [r for e in args.extra for r in extras.get(e, [])]:
            if name_of(requirement) not in local:
                print(requirement)

if __name__ == "__main__":
    main()
