"""What the shard format costs: encode and decode time and size of one rollout shard per codec.

``bench/store.py`` shows that on a large shard the store's remaining cost against raw put/get is
the Parquet encoding itself (zstd), not the row conversion any more. This benchmark measures that
floor: the same Arrow table of rollout rows (``bench.store.make_rows``, converted once with the
store's own schema) encoded as the store does (Parquet, zstd, statistics on the number columns)
and in the alternatives a format change could pick (Parquet with other compressions, Arrow IPC
with none, lz4 or zstd), then decoded back to a table. Token ids are drawn from the tiny models'
384-token vocabulary (what bench/store.py writes) and from a 151,936-token one (Qwen's), because
compression depends on it.

Encode/decode are medians of ``--reps`` repetitions in one process, codecs interleaved; compare
the times with ``put ms``/``get ms`` of bench/store.py's table for the same shard (raw S3 or file
I/O of the Parquet bytes) to see what a codec would save end to end.

    python bench/store_codecs.py                # 8,192 rows x 512 tokens
    python bench/store_codecs.py --quick        # 512 rows x 64 tokens, 2 repetitions
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS, machine, save, table
from bench.store import make_rows
from hacrl_core.store import trajectories

VOCABULARIES = (384, 151_936)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--work", type=Path, help="unused (everything stays in memory); taken like every benchmark's")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.tokens, args.reps = 512, 64, 2
    return args


def shard_table(rows: int, tokens: int, vocabulary: int) -> pa.Table:
    """The store's rollout table for synthetic rows, token ids drawn from ``vocabulary``."""
    dicts = make_rows("bench", 0, "agent", rows, tokens)
    rng = random.Random(vocabulary)
    for row in dicts:
        row["token_ids"] = [rng.randrange(vocabulary) for _ in row["token_ids"]]
    return trajectories._rows_to_table(dicts, trajectories.ROLLOUT_SCHEMA, "rollouts")


def parquet_codec(compression: str) -> tuple[Callable[[pa.Table], bytes], Callable[[bytes], pa.Table]]:
    def encode(t: pa.Table) -> bytes:
        sink = pa.BufferOutputStream()
        pq.write_table(t, sink, compression=compression, write_statistics=trajectories._statistics_columns(t.schema))
        return sink.getvalue().to_pybytes()

    return encode, lambda data: pq.read_table(pa.BufferReader(data))


def ipc_codec(compression: str | None) -> tuple[Callable[[pa.Table], bytes], Callable[[bytes], pa.Table]]:
    def encode(t: pa.Table) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, t.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as writer:
            writer.write_table(t)
        return sink.getvalue().to_pybytes()

    return encode, lambda data: pa.ipc.open_file(pa.BufferReader(data)).read_all()


def store_codec() -> tuple[Callable[[pa.Table], bytes], Callable[[bytes], pa.Table]]:
    """What the store writes (its own encoder, so that this row follows any change to it)."""
    return (lambda t: trajectories._to_parquet(t, "rollouts")), (lambda data: pq.read_table(pa.BufferReader(data)))


CODECS = {
    "parquet zstd (the store's)": store_codec(),
    "parquet zstd, default dictionary limit": parquet_codec("zstd"),
    "parquet lz4": parquet_codec("lz4"),
    "parquet snappy": parquet_codec("snappy"),
    "parquet none": parquet_codec("none"),
    "arrow ipc none": ipc_codec(None),
    "arrow ipc lz4": ipc_codec("lz4"),
    "arrow ipc zstd": ipc_codec("zstd"),
}


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    began = time.perf_counter()
    out = fn()
    return time.perf_counter() - began, out


def measure(t: pa.Table, reps: int) -> dict[str, dict[str, float]]:
    times: dict[str, dict[str, list[float]]] = {name: {"encode": [], "decode": []} for name in CODECS}
    sizes: dict[str, int] = {}
    for _ in range(reps):
        for name, (encode, decode) in CODECS.items():  # interleaved: load falls on every codec
            seconds, data = timed(functools.partial(encode, t))
            times[name]["encode"].append(seconds)
            seconds, back = timed(functools.partial(decode, data))
            times[name]["decode"].append(seconds)
            if not back.equals(t.replace_schema_metadata(back.schema.metadata)):
                raise RuntimeError(f"{name}: the decoded table differs from the encoded one")
            sizes[name] = len(data)
    return {
        name: {
            "encode_ms": statistics.median(v["encode"]) * 1e3,
            "decode_ms": statistics.median(v["decode"]) * 1e3,
            "megabytes": sizes[name] / 1e6,
        }
        for name, v in times.items()
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began, load_before = time.perf_counter(), machine()["uptime"]
    results = {}
    for vocabulary in VOCABULARIES:
        results[vocabulary] = measure(shard_table(args.rows, args.tokens, vocabulary), args.reps)
    baseline = {v: r["parquet zstd (the store's)"] for v, r in results.items()}
    rows = [
        [
            f"{vocabulary:,}",
            name,
            f"{m['megabytes']:.2f}",
            f"{m['megabytes'] / baseline[vocabulary]['megabytes']:.2f}",
            f"{m['encode_ms']:.1f}",
            f"{m['decode_ms']:.1f}",
            f"{(m['encode_ms'] + m['decode_ms']) / (baseline[vocabulary]['encode_ms'] + baseline[vocabulary]['decode_ms']):.2f}",
        ]
        for vocabulary, by_codec in results.items()
        for name, m in by_codec.items()
    ]
    text = table(
        ["vocabulary", "codec", "MB", "size vs store", "encode ms", "decode ms", "encode+decode vs store"], rows
    )
    print(f"shard codecs: {args.rows} rows x {args.tokens} response tokens, median of {args.reps} interleaved reps")
    print(text)
    load = f"before {load_before}; after {machine()['uptime']}"
    print("load:", load)
    path = save(
        "store-codecs-quick" if args.quick else "store-codecs",
        {
            "settings": {"rows": args.rows, "tokens": args.tokens, "reps": args.reps},
            "results": results,
            "table": text,
            "load": load,
            "total_seconds": time.perf_counter() - began,
        },
        args.out,
    )
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
