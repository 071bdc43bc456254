"""The benchmarks. Each runs from the repository root as a module, `python -m bench.<name>`
(`python -m bench.reference steady ...`), so that its imports are the repository's packages
(`inference`, `scripts`, `tests`, `bench`) as they are, with no path set up by hand. What each
measures is in its own docstring; its runs are told in bench/results/JOURNAL.md."""
