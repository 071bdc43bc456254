"""Print what building and installing local distributions needs, one requirement per line, for pip -r.

    python requirements.py PYPROJECT [PYPROJECT ...] [--extra NAME ...]

The image builds install these in a layer of their own, before the source is copied, so a code
change rebuilds only the last, small layer. The list holds each pyproject's dependencies (with the
extras asked for) and its build requirements, so that the source is then installed with
`pip install --no-deps --no-build-isolation` and no network. Requirements on one of the given
distributions themselves (the agent needs the plugin, which is not on PyPI) are left out.
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
    projects, build_requirements = [], []
    for path in args.pyprojects:
        with open(path, "rb") as f:
            pyproject = tomllib.load(f)
        projects.append(pyproject["project"])
        build_requirements += pyproject.get("build-system", {}).get("requires", [])
    local = {name_of(p["name"]) for p in projects}
    unknown = set(args.extra) - {e for p in projects for e in p.get("optional-dependencies", {})}
    if unknown:
        raise SystemExit(f"no such extra in {', '.join(args.pyprojects)}: {', '.join(sorted(unknown))}")
    for project in projects:
        extras = project.get("optional-dependencies", {})
        for requirement in project.get("dependencies", []) + [r for e in args.extra for r in extras.get(e, [])]:
            if name_of(requirement) not in local:
                print(requirement)
    for requirement in dict.fromkeys(build_requirements):  # once each, in order
        print(requirement)


if __name__ == "__main__":
    main()
