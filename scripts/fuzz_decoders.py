"""The long fuzzing target: millions of generated inputs through the wire, header and grid payload decoders.

    .venv/bin/python scripts/fuzz_decoders.py [--inputs 1000000] [--seed 1] [--jobs 2] [--stack-frames 20000]

The inputs come from the generators of tests/unit/fuzzwire.py (arbitrary bytes; real frames captured from
simulated fifo, vsync and total-order groups, mutated byte-wise and structurally; grid payloads of every message
type, mutated the same ways; arbitrary values for every header decoder). Every decoder must return or raise
WireError naming the field; anything else stops the run with a traceback (the work unit's seed replays it).
``--stack-frames N`` also feeds N hostile-but-decodable frames to whole member stacks of each preset.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _chunk(args: tuple[int, int]) -> tuple[dict[str, dict[str, int]], float]:
    from tests.unit import fuzzwire as fz

    n, seed = args
    start = time.perf_counter()
    counts = fz.run_inputs(n, seed)
    return counts, time.perf_counter() - start


def _stack_frames(n: int, seed: int) -> dict[str, int]:
    import random

    from tests.unit import fuzzwire as fz

    fed: dict[str, int] = {}
    for preset in ("fifo", "vsync", "total-order"):
        target = fz.StackTarget(preset)
        rng = random.Random(f"{seed}-{preset}")
        frames = fz.corpus_frames()
        fed[preset] = 0
        for _ in range(n):
            base = rng.choice(frames)
            r = rng.random()
            data = fz.mutate_header_ints(base, rng) if r < 0.8 else fz.mutate_structure(base, rng)
            if fz.check_frame_decoder(data) == "ok":
                target.feed(data)
                fed[preset] += 1
        target.stack.fire_timers(target.now + 60.0)
    return fed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=50_000, help="inputs per work unit (each has its own seed)")
    parser.add_argument("--stack-frames", type=int, default=20_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from tests.unit import fuzzwire as fz

    corpus = fz.frame_corpus()  # built once here; forked workers inherit it
    units = [(min(args.chunk, args.inputs - i), args.seed * 1_000_003 + k)
             for k, i in enumerate(range(0, args.inputs, args.chunk))]  # fmt: skip
    total: dict[str, dict[str, int]] = {}
    start = time.perf_counter()
    done = 0
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for (counts, _secs), (n, _) in zip(pool.map(_chunk, units), units, strict=True):
            done += n
            for target, by in counts.items():
                agg = total.setdefault(target, {})
                for k, v in by.items():
                    agg[k] = agg.get(k, 0) + v
            print(f"  {done} inputs, {time.perf_counter() - start:.0f}s", file=sys.stderr)
    elapsed = time.perf_counter() - start
    fed = _stack_frames(args.stack_frames, args.seed) if args.stack_frames else {}
    result = {
        "inputs": args.inputs,
        "seed": args.seed,
        "corpus_frames": len(corpus),
        "seconds": round(elapsed, 1),
        "inputs_per_second": round(args.inputs / elapsed),
        "by_target": total,
        "decoder_calls": sum(sum(v.values()) for v in total.values()),
        "stack_frames_fed": fed,
        "crashes": 0,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"fuzzed {args.inputs} inputs ({result['decoder_calls']} decoder calls) in {elapsed:.0f}s, seed "
            f"{args.seed}: no exception other than WireError"
        )
        for target, by in total.items():
            print(f"  {target:>7}: {by.get('ok', 0)} accepted, {by.get('rejected', 0)} rejected")
        if fed:
            print(f"  hostile decodable frames fed to member stacks without an error: {fed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
