"""bench/agent_cost.py's report of the two plugins' runs: each plugin's own table, and per N
the median over the interleaved rounds of each plugin's agent CPU per call, side by side."""

from __future__ import annotations

import argparse

from bench import agent_cost
from bench.agent_cost import CallStats, Memory, Run


def run(plugin: str, calls: int, agent_cores: float, rss: float = 130.0) -> Run:
    """A run whose agent (job + inference + worker) took `agent_cores` per call."""
    return Run(plugin=plugin, calls=calls, window_s=30.0,
               cpu={"job": 0.8 * agent_cores * calls, "inference": 0.1 * agent_cores * calls,
                    "worker": 0.1 * agent_cores * calls},
               job_cpu=[0.8 * agent_cores] * calls, job_threads={"main (the event loop)": 0.05 * calls},
               job_memory=[Memory(rss, 40, 60)] * calls, idle_memory=[Memory(100, 10, 20)],
               agent_pss_mb=500 + 50 * calls, stats=[CallStats(turns=3, voice_to_voice=[1.0])] * calls)


def test_both_plugins_per_call_medians_over_the_rounds():
    runs = [run("omni", 1, 0.20), run("livekit-openai", 1, 0.22),
            run("omni", 2, 0.17), run("livekit-openai", 2, 0.19, rss=150),
            run("livekit-openai", 2, 0.18, rss=150), run("omni", 2, 0.15),
            run("omni", 2, 0.30), run("livekit-openai", 2, 0.20, rss=150)]
    text = agent_cost.report(runs, argparse.Namespace())
    assert "== this project's livekit-plugins-omni" in text and "== LiveKit's livekit-plugins-openai" in text
    lines = text.splitlines()
    # medians at the largest N: omni 17.0 (of 15, 17, 30), livekit 19.0 (of 18, 19, 20)
    assert lines[-2] == ("agent CPU per call, this project's livekit-plugins-omni: 17.0 % of a core, "
                         "job RSS: 130 MB (at 2 calls)")
    assert lines[-1] == ("agent CPU per call, LiveKit's livekit-plugins-openai: 19.0 % of a core, "
                         "job RSS: 150 MB (at 2 calls)")
    side_by_side = lines[lines.index(next(line for line in lines if line.startswith("== the same calls"))) + 2:]
    assert side_by_side[0].split() == ["1", "|", "20.0", "(16.0)", "n=1", "|", "22.0", "(17.6)", "n=1"]
    assert side_by_side[1].split()[:5] == ["2", "|", "17.0", "(13.6)", "n=3"]


def test_one_plugin_alone():
    text = agent_cost.report([run("omni", 2, 0.12)], argparse.Namespace())
    assert "livekit-plugins-openai" not in text
    assert text.splitlines()[-1].startswith("agent CPU per call, this project's livekit-plugins-omni: 12.0 %")


def test_rounds_of_one_call_count_report_without_a_fit():
    """Rounds at a single N: there is no line to fit (every run has the same N), the per-call
    figures still come out."""
    runs = [run("omni", 4, 0.16), run("livekit-openai", 4, 0.18), run("omni", 4, 0.14), run("livekit-openai", 4, 0.20)]
    text = agent_cost.report(runs, argparse.Namespace())
    assert "least squares" not in text
    assert text.splitlines()[-2].startswith("agent CPU per call, this project's livekit-plugins-omni: 15.0 %")
