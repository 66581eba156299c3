"""Store throughput: trajectory shards against raw object put/get of the same bytes (SeaweedFS S3).

Synthetic rollout rows shaped like the runtime's (prompt, response text, token ids, reward,
finish reason, extra JSON) are written with ``TrajectoryStore.write_rollouts`` (Parquet encoding,
data object, then a commit marker with size and sha256) and read back with ``read_rollouts``
(marker, data, checksum, decoding into row dicts). The raw baseline puts and gets exactly the
Parquet bytes of that shard with a plain boto3 client on the same server. Repetitions are
interleaved (raw, shard, raw, shard, ...), medians reported.

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
    p.add_argument("--work", type=Path, default=Path("/tmp/hacrl-bench/store"))
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.tokens, args.reps = "512", "8", 2
    return args


def make_rows(experiment: str, step: int, agent: str, count: int, tokens: int, seed: int = 0) -> list[dict[str, Any]]:
    """Rows like the rollout worker's: G=8 samples per prompt, arithmetic prompts, random responses."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        ids = [rng.randrange(384) for _ in range(tokens)]
        rows.append({
            "experiment": experiment, "step": step, "source_agent": agent, "policy_version": step, "tokenizer_id": "bpe-384-abcdef",
            "prompt_uid": f"arith-{i // 8:06d}", "sample_index": i % 8,
            "prompt": f"<|im_start|>user\n{a}+{b}=<|im_end|>\n<|im_start|>assistant\n",
            "response": "".join(chr(48 + t % 10) for t in ids), "token_ids": ids, "reward": float(rng.random() < 0.3),
            "finish_reason": "stop" if rng.random() < 0.9 else "length",
            "extra": json.dumps({"question": f"{a}+{b}=", "answer": str(a + b)}),
        })
    return rows


def run_case(store, raw_put, raw_get, rows: list[dict[str, Any]], reps: int, step0: int, agent: str, raw_prefix: str) -> dict[str, Any]:
    """Interleaved raw and shard round trips of one shard; medians in seconds and MB/s."""
    from hacrl_core.store.trajectories import rollouts_from_parquet, rollouts_to_parquet

    data = rollouts_to_parquet(rows)
    mb = len(data) / 1e6
    times: dict[str, list[float]] = {"raw_put": [], "raw_get": [], "shard_write": [], "shard_read": [], "encode": [], "decode": []}
    for rep in range(-1, reps):  # rep -1 warms up (imports, connections) and is not recorded
        step = step0 + rep + 1
        key = f"{raw_prefix}/{step:06d}/{agent}.parquet"
        if rep < 0:
            raw_put(key, data), raw_get(key), store.write_rollouts(step, agent, [{**r, "step": step} for r in rows]), store.read_rollouts(step, agent)
            continue
        began = time.perf_counter()
        raw_put(key, data)
        times["raw_put"].append(time.perf_counter() - began)
        began = time.perf_counter()
        got = raw_get(key)
        times["raw_get"].append(time.perf_counter() - began)
        assert len(got) == len(data)
        shard_rows = [{**r, "step": step} for r in rows]
        began = time.perf_counter()
        store.write_rollouts(step, agent, shard_rows)
        times["shard_write"].append(time.perf_counter() - began)
        began = time.perf_counter()
        back = store.read_rollouts(step, agent)
        times["shard_read"].append(time.perf_counter() - began)
        assert len(back) == len(rows)
        began = time.perf_counter()
        rollouts_to_parquet(shard_rows)
        times["encode"].append(time.perf_counter() - began)
        began = time.perf_counter()
        rollouts_from_parquet(data)
        times["decode"].append(time.perf_counter() - began)
    med = {k: statistics.median(v) for k, v in times.items()}
    raw_rt, shard_rt = med["raw_put"] + med["raw_get"], med["shard_write"] + med["shard_read"]
    return {
        "rows": len(rows), "bytes": len(data), "bytes_per_1000_rows": len(data) * 1000 / len(rows), "times": times, "median": med,
        "raw_mb_s": 2 * mb / raw_rt, "shard_mb_s": 2 * mb / shard_rt, "ratio": raw_rt / shard_rt,
        "write_ratio": med["raw_put"] / med["shard_write"], "read_ratio": med["raw_get"] / med["shard_read"],
        # the rest of each shard operation: commit marker, checksum, marker lookup, extra requests
        "write_commit_seconds": med["shard_write"] - med["encode"] - med["raw_put"],
        "read_commit_seconds": med["shard_read"] - med["decode"] - med["raw_get"],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
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
            "s3": (open_trajectory_store(f"s3://{server.bucket}/traj", "bench-store", endpoint=server.endpoint),
                   lambda k, d: client.put_object(Bucket=server.bucket, Key=k, Body=d),
                   lambda k: client.get_object(Bucket=server.bucket, Key=k)["Body"].read()),
            "file": (open_trajectory_store(f"file://{args.work / 'files'}", "bench-store"), *file_raw(args.work / "raw")),
        }
        step = 0
        for count in [int(x) for x in args.rows.split(",")]:
            for tokens in [int(x) for x in args.tokens.split(",")]:
                rows = make_rows("bench-store", 0, "agent-a", count, tokens)
                for backend, (store, put, get) in backends.items():
                    case = run_case(store, put, get, rows, args.reps, step, "agent-a", "raw")
                    case.update(backend=backend, response_tokens=tokens)
                    results.append(case)
                    step += args.reps + 1
                    print(f"{backend} {count} rows x {tokens} tokens: ratio {case['ratio']:.2f}", flush=True)
    finally:
        server.stop()
    rows_out = [[r["backend"], r["rows"], r["response_tokens"], f"{r['bytes'] / 1e3:,.0f}", f"{r['bytes_per_1000_rows'] / 1e3:,.1f}",
                 f"{r['raw_mb_s']:.1f}", f"{r['shard_mb_s']:.1f}", f"{r['ratio']:.2f}", f"{r['write_ratio']:.2f}", f"{r['read_ratio']:.2f}"]
                + [f"{r['median'][k] * 1000:.1f}" for k in ("raw_put", "encode", "shard_write", "raw_get", "decode", "shard_read")]
                for r in results]
    text = table(["store", "rows", "resp tokens", "shard kB", "kB / 1000 rows", "raw MB/s", "shard MB/s", "ratio (put+get)",
                  "write ratio", "read ratio",
                  "put ms", "encode ms", "write ms", "get ms", "decode ms", "read ms"], rows_out)
    print(f"\nstore throughput (median of {args.reps} interleaved reps; MB = Parquet bytes; ratio = shard / raw throughput)\n{text}")
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    path = save("store-quick" if args.quick else "store", {"settings": settings, "table": text, "results": results,
                                                            "total_seconds": time.perf_counter() - began}, args.out)
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
