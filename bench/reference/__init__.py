"""Benchmark the reference engine: first audio, real-time factor, gaps, queue wait, memory.

    python -m bench.reference SUBCOMMAND [--model M] [--preset P] [--engine-option K=V] [--variants A,B] ...

On a GPU it builds random weights at a family's published shapes in memory (`--model
qwen2.5-omni`, the default: Qwen2.5-Omni-7B in bf16 with token2wav in fp32; `--model
qwen3-omni`: Qwen3-Omni-30B-A3B; each family's `shapes.py`) and measures the engine on them.
`--model tiny-random` or `--model tiny-random-qwen3-omni` runs the same path on a family's
tiny random model, on the CPU unless `--device` says otherwise. Every subcommand starts one
engine per variant (`--variants`, see VARIANTS in harness.py) over the one model, prints what
the engine's `describe()` says of it (family, preset, every option, the runner: slots, batch
buckets, CUDA graphs, streams, audio decoder), warms it up with one untimed reply, then:

    python -m bench.reference burst                      # GPU: 1, 4, 8, 16, 32, 64 sessions
    python -m bench.reference burst --sessions 1,16 --repeats 3
    python -m bench.reference steady --levels 8,12,16,20,24 --input 1-6 --reply 1-10   # a real call mix
    python -m bench.reference steady --seconds 25 \\
        --pattern 3/4@32,40 --pattern 1-6/1-10@32,40 --pattern 2/8@28,32
    python -m bench.reference conversation --turns 30
    python -m bench.reference check                      # each variant against the eager path
    python -m bench.reference profile --costs-out costs.json
    python -m bench.reference burst --model tiny-random  # CPU: 1 and 4 sessions

`burst`: N concurrent sessions per level (`--sessions`), each reply with `--input-seconds` of
input audio and `--audio-seconds` of speech, `--repeats` rounds. Per level it prints first
audio p50/p95, the silence a listener playing each packet on arrival hears after the first
packet (p50 and worst), RTF (wall time of a reply / its audio; < 1 is faster than real time)
p50/p95, the aggregate speed (audio seconds produced per wall second by all sessions
together, and its ratio to one session's), queue wait p95, the largest decode batch and GPU
memory; then the first audio phase by phase and what the engine loop did.

`steady`: calls as they really arrive. At each level (`--levels`, in ascending order) that
many calls start staggered over `--stagger` seconds; each caller speaks (its request goes in
at the end of its speech), hears the reply in real time, then speaks again, for `--seconds`;
its conversation grows turn by turn on its own session (the prefix cache at work). How long a
caller speaks and how long each reply is are `--input` and `--reply`: a fixed value (default
`--input-seconds` and `--audio-seconds`) or a range, e.g. `--input 1-6 --reply 1-10`, drawn
per turn from `--seed` (the same mix on every run). `--pattern IN/REPLY@LEVELS` (repeatable)
runs several such patterns one after another on one engine, each with its own levels and
closing lines. Per level: replies with no audio, first audio p50/p95, the share of replies
whose listener hears more than 0.1 s of silence after the first packet or no audio at all
(and that silence's p50), the share of the calls' time the agent talks, the audio seconds
made per wall second, and what the engine loop did (decode step and token2wav run times,
batch sizes); then two closing lines: `calls per GPU (steady, gap-free): N`, the largest
level with first audio p95 ≤ 0.6 s and at most 5 % of replies gapped or silent, counting up
from the lowest level to the first that is not (bench/steady_mix.py), and `gap-free audio per
GPU: X s/s`, the most audio seconds per second made at such a level. A level still running
after STEADY_LEVEL_LIMIT × its time is cut, reported as past capacity, and the higher levels
are skipped; a level whose engine loop makes no step for 5 s while replies run prints a stall
report (each reply's state as the scheduler sees it, and a py-spy dump of the process's
threads). `--py-spy-level N` samples the process with py-spy for 10 s at level N (where the
engine loop's host time goes).

`conversation`: one session, `--turns` turns; each adds a new user clip and the reply's
transcript. It prints first audio per turn, turn N / turn 2, and each phase of the first
audio at turn 2 and at the last.

`check`: runs the family's tiny random model in float32 with a greedy talker eagerly (no
graphs, nothing compiled, the vocoder's activations as modules, with the variant's other
options) and as each variant configures it (CUDA graphs, compiled steps, the fused vocoder
kernel, ...) and compares four concurrent replies: text and codes must be equal and the
audio within CHECK_AUDIO_TOLERANCE (check.py). It exits 1 when one is not. On a CPU nothing is
captured, so it checks the harness and the options rather than the graphs.

`profile`: times every step the runner names (its `profiled_steps()`: decode steps per batch
bucket, prompt chunks per attention window, ODE solves per (steps, batch, frames), vocoder or
code2wav windows, and Qwen3-Omni's eager parts before the first audio), and for Qwen2.5-Omni
the thinker's and talker's steps side by side on their two streams, its audio encoder and how
far fewer ODE steps move the audio, in milliseconds: what bench/schedule_sim.py's cost model
needs (`--costs-out FILE` writes them as JSON). `--slots` sets the batch buckets captured.

Variants: the first runs the subcommand as given, the others at `--variant-sessions` (burst)
or `--variant-levels` (steady), by default the first level. `--preset` (default `exact`)
fills in what no variant or `--engine-option` sets.
"""
