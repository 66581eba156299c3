"""Store throughput: trajectory shards against raw object put/get of the same bytes (SeaweedFS S3).

Synthetic rollout rows shaped like the runtime's (prompt, response text, token ids, reward,
finish reason, extra JSON) are written with ``TrajectoryStore.write_rollouts`` (Parquet encoding,
data object, then a commit marker with size and sha256) and read back with ``read_rollouts``
(marker, data, checksum, decoding into row dicts), and again through the columnar API
(``write_rollouts_columns`` of a pyarrow Table, ``read_rollouts_columns`` back to one). The raw
baseline puts and gets exactly the Parquet bytes of that shard with a plain boto3 client on the
same server. Repetitions are interleaved (raw, rows, columns, raw, ...), medians reported. The
columns table also gives the ratio against the store's own ``put``/``get`` of the same bytes
(``ObjectStore``: on the file store an atomic, fsynced write, which the raw baseline is not).

Throughput is in MB of Parquet bytes per second for both, so the ratio shard / raw (limit 1.0)
is the cost of encoding, checksums and the commit marker. Also: shard bytes per 1,000 rows, and
the same measurement on the file store for reference.

    python bench/store.py            # rows x response lengths: 512 and 8192 rows, 8 and 512 tokens
    python bench/store.py --quick    # 512 rows, 8 tokens, 2 repetitions
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, RESULTS, save, table


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rows", default="512,8192")
    p.add_argument("--tokens", default="8,512", help="response lengths in tokens")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument(
        "--vocabulary", type=int, default=384, help="token ids drawn below this (384: tiny models; 151936: Qwen)"
    )
    p.add_argument("--work", type=Path, default=Path("/tmp/hacrl-bench/store"))
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.tokens, args.reps = "512", "8", 2
    return args


def make_rows(
    experiment: str, step: int, agent: str, count: int, tokens: int, seed: int = 0, vocabulary: int = 384
) -> list[dict[str, Any]]:
    """Rows like the rollout worker's: G=8 samples per prompt, arithmetic prompts, random responses
    of token ids below ``vocabulary`` (384: the tiny models'; 151,936: Qwen's)."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        ids = [rng.randrange(vocabulary) for _ in range(tokens)]
        rows.append(
            {
                "experiment": experiment,
                "step": step,
                "source_agent": agent,
                "policy_version": step,
                "tokenizer_id": "bpe-384-abcdef",
                "prompt_uid": f"arith-{i // 8:06d}",
                "sample_index": i % 8,
                "prompt": f"<|im_start|>user\n{a}+{b}=<|im_end|>\n<|im_start|>assistant\n",
                "response": "".join(chr(48 + t % 10) for t in ids),
                "token_ids": ids,
                "reward": float(rng.random() < 0.3),
                "finish_reason": "stop" if rng.random() < 0.9 else "length",
                "extra": json.dumps({"question": f"{a}+{b}=", "answer": str(a + b)}),
            }
        )
    return rows


def run_case(
    store, raw_put, raw_get, rows: list[dict[str, Any]], reps: int, step0: int, agent: str, raw_prefix: str
) -> dict[str, Any]:
    """Interleaved raw, row and column round trips of one shard; medians in seconds and MB/s.

    rows: ``write_rollouts`` of row dicts, ``read_rollouts`` back to row dicts (what the workers
    call today). columns: ``write_rollouts_columns`` of a pyarrow Table, ``read_rollouts_columns``
    back to a Table (for a caller that holds columns; building the Table from rows is not timed).
    """
    import pyarrow as pa

    from hacrl_core.store.trajectories import (
        ROLLOUT_SCHEMA,
        rollouts_from_parquet,
        rollouts_table_from_parquet,
        rollouts_table_to_parquet,
        rollouts_to_parquet,
    )

    data = rollouts_to_parquet(rows)
    mb = len(data) / 1e6
    names = (
        "raw_put",
        "raw_get",
        "object_put",
        "object_get",
        "shard_write",
        "shard_read",
        "encode",
        "decode",
        "columns_write",
        "columns_read",
        "table_encode",
        "table_decode",
    )
    times: dict[str, list[float]] = {name: [] for name in names}

    def timed(name: str, call, *args):
        began = time.perf_counter()
        result = call(*args)
        if name:
            times[name].append(time.perf_counter() - began)
        return result

    for rep in range(-1, reps):  # rep -1 warms up (imports, connections) and is not recorded
        record = (lambda name: name) if rep >= 0 else (lambda name: "")
        step = step0 + 2 * (rep + 1)
        key = f"{raw_prefix}/{step:06d}/{agent}.parquet"
        timed(record("raw_put"), raw_put, key, data)
        got = timed(record("raw_get"), raw_get, key)
        assert len(got) == len(data)
        # The store's own put/get of the same bytes: atomic and fsynced on the file store, where
        # the raw baseline is a plain write; the same boto3 call as raw on S3.
        timed(record("object_put"), store.objects.put, key, data)
        timed(record("object_get"), store.objects.get, key)
        shard_rows = [{**r, "step": step} for r in rows]
        timed(record("shard_write"), store.write_rollouts, step, agent, shard_rows)
        back = timed(record("shard_read"), store.read_rollouts, step, agent)
        assert len(back) == len(rows)
        table = pa.Table.from_pylist([{**r, "step": step + 1} for r in rows], schema=ROLLOUT_SCHEMA)
        timed(record("columns_write"), store.write_rollouts_columns, step + 1, agent, table)
        back = timed(record("columns_read"), store.read_rollouts_columns, step + 1, agent)
        assert back.num_rows == len(rows)
        timed(record("encode"), rollouts_to_parquet, shard_rows)
        timed(record("decode"), rollouts_from_parquet, data)
        timed(record("table_encode"), rollouts_table_to_parquet, table)
        timed(record("table_decode"), rollouts_table_from_parquet, data)
    med = {k: statistics.median(v) for k, v in times.items()}
    raw_rt = med["raw_put"] + med["raw_get"]
    rows_rt, cols_rt = med["shard_write"] + med["shard_read"], med["columns_write"] + med["columns_read"]
    return {
        "rows": len(rows),
        "bytes": len(data),
        "bytes_per_1000_rows": len(data) * 1000 / len(rows),
        "times": times,
        "median": med,
        "raw_mb_s": 2 * mb / raw_rt,
        "shard_mb_s": 2 * mb / rows_rt,
        "ratio": raw_rt / rows_rt,
        "write_ratio": med["raw_put"] / med["shard_write"],
        "read_ratio": med["raw_get"] / med["shard_read"],
        "columns_mb_s": 2 * mb / cols_rt,
        "columns_ratio": raw_rt / cols_rt,
        "columns_ratio_vs_object": (med["object_put"] + med["object_get"]) / cols_rt,
        "columns_write_ratio": med["raw_put"] / med["columns_write"],
        "columns_read_ratio": med["raw_get"] / med["columns_read"],
        # the rest of each shard operation: commit marker, checksum, marker lookup, extra requests
        "write_commit_seconds": med["columns_write"] - med["table_encode"] - med["raw_put"],
        "read_commit_seconds": med["columns_read"] - med["table_decode"] - med["raw_get"],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    load_before = os.popen("uptime").read().strip()
    sys.path.insert(0, str(REPO))
    from hacrl_core.store import open_trajectory_store
    from tests.support.seaweed import start_seaweedfs

    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    server = start_seaweedfs(args.work / "seaweed")
    results: list[dict[str, Any]] = []
    try:
        os.environ.update(server.env())
        client = server.client()
        backends = {
            "s3": (
                open_trajectory_store(f"s3://{server.bucket}/traj", "bench-store", endpoint=server.endpoint),
                lambda k, d: client.put_object(Bucket=server.bucket, Key=k, Body=d),
                lambda k: client.get_object(Bucket=server.bucket, Key=k)["Body"].read(),
            ),
            "file": (
                open_trajectory_store(f"file://{args.work / 'files'}", "bench-store"),
                *file_raw(args.work / "raw"),
            ),
        }
        step = 0
        for count in [int(x) for x in args.rows.split(",")]:
            for tokens in [int(x) for x in args.tokens.split(",")]:
                rows = make_rows("bench-store", 0, "agent-a", count, tokens, vocabulary=args.vocabulary)
                for backend, (store, put, get) in backends.items():
                    case = run_case(store, put, get, rows, args.reps, step, "agent-a", "raw")
                    case.update(backend=backend, response_tokens=tokens)
                    results.append(case)
                    step += 2 * (args.reps + 1)
                    print(
                        f"{backend} {count} rows x {tokens} tokens: ratio rows {case['ratio']:.2f}, "
                        f"columns {case['columns_ratio']:.2f}",
                        flush=True,
                    )
    finally:
        server.stop()
    rows_out = [
        [
            r["backend"],
            r["rows"],
            r["response_tokens"],
            f"{r['bytes'] / 1e3:,.0f}",
            f"{r['bytes_per_1000_rows'] / 1e3:,.1f}",
            f"{r['raw_mb_s']:.1f}",
            f"{r['shard_mb_s']:.1f}",
            f"{r['ratio']:.2f}",
            f"{r['write_ratio']:.2f}",
            f"{r['read_ratio']:.2f}",
        ]
        + [
            f"{r['median'][k] * 1000:.1f}"
            for k in ("raw_put", "encode", "shard_write", "raw_get", "decode", "shard_read")
        ]
        for r in results
    ]
    text = table(
        [
            "store",
            "rows",
            "resp tokens",
            "shard kB",
            "kB / 1000 rows",
            "raw MB/s",
            "shard MB/s",
            "ratio (put+get)",
            "write ratio",
            "read ratio",
            "put ms",
            "encode ms",
            "write ms",
            "get ms",
            "decode ms",
            "read ms",
        ],
        rows_out,
    )
    cols_out = [
        [
            r["backend"],
            r["rows"],
            r["response_tokens"],
            f"{r['raw_mb_s']:.1f}",
            f"{r['columns_mb_s']:.1f}",
            f"{r['columns_ratio']:.2f}",
            f"{r['columns_write_ratio']:.2f}",
            f"{r['columns_read_ratio']:.2f}",
            f"{r['columns_ratio_vs_object']:.2f}",
            f"{r['median']['object_put'] * 1000:.1f}",
        ]
        + [
            f"{r['median'][k] * 1000:.1f}"
            for k in ("raw_put", "table_encode", "columns_write", "raw_get", "table_decode", "columns_read")
        ]
        + [f"{r['write_commit_seconds'] * 1000:.1f}", f"{r['read_commit_seconds'] * 1000:.1f}"]
        for r in results
    ]
    text_cols = table(
        [
            "store",
            "rows",
            "resp tokens",
            "raw MB/s",
            "columns MB/s",
            "ratio (put+get)",
            "write ratio",
            "read ratio",
            "ratio vs store put+get",
            "store put ms",
            "put ms",
            "encode ms",
            "write ms",
            "get ms",
            "decode ms",
            "read ms",
            "write rest ms",
            "read rest ms",
        ],
        cols_out,
    )
    print(
        f"\nstore throughput, row dicts (median of {args.reps} interleaved reps; MB = Parquet bytes; ratio = shard / raw throughput)"
        f"\n{text}"
    )
    print(f"\nstore throughput, Arrow tables (write_rollouts_columns / read_rollouts_columns; same reps)\n{text_cols}")
    print(f"load: before {load_before}; after {os.popen('uptime').read().strip()}")
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    path = save(
        "store-quick" if args.quick else "store",
        {
            "settings": settings,
            "table": text,
            "columns_table": text_cols,
            "load_before": load_before,
            "results": results,
            "total_seconds": time.perf_counter() - began,
        },
        args.out,
    )
    print(f"wrote {path}")
    return 0


def file_raw(root: Path):
    """Raw put/get of bytes as plain files (the file store's baseline)."""

    def put(key: str, data: bytes) -> None:
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def get(key: str) -> bytes:
        return (root / key).read_bytes()

    return put, get


if __name__ == "__main__":
    raise SystemExit(main())
