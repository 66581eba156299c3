"""Weight publishes: bytes and seconds of full vs delta publishes, file store and S3 (SeaweedFS).

A ``tiny://`` llama widened and deepened to about 113M parameters (hidden 768, 16 layers, built
offline, not warm-started) trains with AdamW on fp32 master weights (the torch backend at dtype
float32; DeepSpeed bf16 keeps fp32 masters as well) for ``--steps`` steps at each learning rate, on
a few rows of random tokens per step: with Adam each weight moves by about lr whatever the batch.
After every step the bf16 copy (what the rollout engines consume, and what a DeepSpeed bf16
learner publishes) is saved as the learner saves it and published through
``weight_chain.publish_policy`` twice per backend: ``full`` (``fullPublishEvery`` 1, every version
whole, as before deltas) and ``delta`` (``--full-every``, default the spec's 10). One reader
replica per (backend, mode) follows every version with ``fetch_policy`` (steady state: the
delta), and a new replica fetches the last version from nothing (the full publish and its deltas).

Reported per version: the share of bf16 elements that changed (and of the fp32 masters, which is
why an fp32 publish is always full), bytes written, bytes a replica reads, seconds to publish
(read the saved directory, checksum, delta, upload) and to fetch and apply (download, apply,
checksum, rewrite the local files). The bytes are the files' sizes; the ratio to a full bf16
publish is what the goal of docs/benchmarks.md is stated in.

    python bench/weights.py            # ~113M parameters, 10 steps at lr 1e-6 and 1e-5
    python bench/weights.py --quick    # the small llama-char preset, 2 steps at lr 1e-5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_CACHE, RESULTS, build_models, save, table

BIG = "tiny://llama-char?seed=0&warmup_steps=0&hidden=768&layers=16"
SMALL = "tiny://llama-char?seed=0&warmup_steps=0"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--model", default=BIG)
    p.add_argument("--lrs", default="1e-6,1e-5")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rows", type=int, default=4, help="rows of random tokens per step")
    p.add_argument("--tokens", type=int, default=32, help="tokens per row")
    p.add_argument("--full-every", type=int, default=10, help="fullPublishEvery of the delta mode")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    p.add_argument("--work", type=Path, default=Path("/tmp/hacrl-bench/weights"))
    p.add_argument("--keep", action="store_true", help="keep --work (the stores it wrote) after the run")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.lrs, args.steps = SMALL, "1e-5", 2
    return args


def changed_fraction(old: dict, new: dict) -> float:
    from hacrl_core.store.weight_deltas import state_delta

    return state_delta(old, new).changed_fraction()


def train_and_publish(
    args: argparse.Namespace, model_dir: Path, lr: float, stores: dict[str, Any]
) -> list[dict[str, Any]]:
    """``args.steps`` AdamW steps at ``lr``; after each (and before the first) the bf16 copy is
    published to every (backend, mode) and fetched by that pair's follower replica."""
    import torch

    from hacrl_core.models.loading import load_policy, save_policy
    from hacrl_core.store.weight_chain import fetch_policy, publish_policy

    torch.manual_seed(0)
    model, tokenizer = load_policy(model_dir, dtype=torch.float32)
    model.train()
    published, _ = load_policy(model_dir, dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    vocab = model.config.vocab_size
    work = args.work / f"lr-{lr:g}"
    previous_fp32 = previous_bf16 = None
    records = []
    for version in range(args.steps + 1):
        record: dict[str, Any] = {"lr": lr, "version": version}
        if version:
            began = time.perf_counter()
            ids = torch.randint(0, vocab, (args.rows, args.tokens))
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            record["train_seconds"] = time.perf_counter() - began
        with torch.no_grad():
            for target, source in zip(published.parameters(), model.parameters(), strict=True):
                target.copy_(source)  # round to nearest even, as .to(bfloat16)
        fp32 = {k: v.detach().clone() for k, v in model.state_dict().items()}
        bf16 = {k: v.detach().clone() for k, v in published.state_dict().items()}
        if previous_fp32 is not None:
            record["changed_fp32"] = changed_fraction(previous_fp32, fp32)
            record["changed_bf16"] = changed_fraction(previous_bf16, bf16)
        previous_fp32, previous_bf16 = fp32, bf16
        saved = work / "saved"
        began = time.perf_counter()
        save_policy(published, tokenizer, saved)
        record["save_seconds"] = time.perf_counter() - began
        record["full_bytes"] = sum(p.stat().st_size for p in saved.glob("*.safetensors"))
        for (backend, mode), store in stores.items():
            copy = work / f"{backend}-{mode}" / "to-publish"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(saved, copy)
            began = time.perf_counter()
            result = publish_policy(
                store,
                "agent",
                version,
                copy,
                work / f"{backend}-{mode}" / "reference",
                full_every=1 if mode == "full" else args.full_every,
            )
            publish_seconds = time.perf_counter() - began
            began = time.perf_counter()
            fetched = fetch_policy(store, "agent", version, work / f"{backend}-{mode}" / "replica")
            fetch_seconds = time.perf_counter() - began
            assert fetched.version == version, fetched
            record[f"{backend}/{mode}"] = {
                "kind": result.kind,
                "written": result.bytes_written,
                "read": fetched.bytes_read,
                "publish_seconds": publish_seconds,
                "fetch_seconds": fetch_seconds,
            }
        records.append(record)
        shown = {k: v["kind"] + f" {v['written'] / 1e6:.1f}MB" for k, v in record.items() if isinstance(v, dict)}
        print(
            f"lr {lr:g} version {version}: changed bf16 {record.get('changed_bf16', float('nan')):.4f} "
            f"fp32 {record.get('changed_fp32', float('nan')):.4f} {shown}",
            flush=True,
        )
    for (backend, mode), store in stores.items():  # a new replica at the last version
        target = work / f"{backend}-{mode}" / "new-replica"
        began = time.perf_counter()
        fetched = fetch_policy(store, "agent", args.steps, target)
        records[-1][f"{backend}/{mode}"].update(
            new_replica_read=fetched.bytes_read,
            new_replica_seconds=time.perf_counter() - began,
            new_replica_deltas=fetched.deltas_applied,
        )
    return records


def summarize(records: list[dict[str, Any]], keys: list[str]) -> list[dict[str, Any]]:
    """Per (lr, backend/mode): means over versions 1.. of the ratios to a full bf16 publish."""
    out = []
    for lr in sorted({r["lr"] for r in records}):
        runs = [r for r in records if r["lr"] == lr and r["version"] > 0]
        full = statistics.fmean(r["full_bytes"] for r in runs)
        for key in keys:
            entries = [r[key] for r in runs]
            deltas = [e["written"] for e in entries if e["kind"] == "delta"]
            out.append(
                {
                    "lr": lr,
                    "store/mode": key,
                    "full_bytes": full,
                    "changed_bf16": statistics.fmean(r["changed_bf16"] for r in runs),
                    "changed_fp32": statistics.fmean(r["changed_fp32"] for r in runs),
                    "delta_over_full": statistics.fmean(deltas) / full if deltas else None,
                    "written_over_full": statistics.fmean(e["written"] for e in entries) / full,
                    "read_over_full": statistics.fmean(e["read"] for e in entries) / full,
                    "publish_seconds": statistics.median(e["publish_seconds"] for e in entries),
                    "fetch_seconds": statistics.median(e["fetch_seconds"] for e in entries),
                    "new_replica_over_full": runs[-1][key]["new_replica_read"] / full,
                    "new_replica_seconds": runs[-1][key]["new_replica_seconds"],
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    load_before = os.popen("uptime").read().strip()
    from hacrl_core.models.uri import resolve_model
    from hacrl_core.store import open_trajectory_store
    from tests.support.seaweed import start_seaweedfs

    build_models([args.model], args.cache)
    model_dir = Path(resolve_model(args.model, args.cache / "models"))
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    server = start_seaweedfs(args.work / "seaweed")
    records: list[dict[str, Any]] = []
    try:
        os.environ.update(server.env())
        stores = {}
        for mode in ("full", "delta"):
            stores[("file", mode)] = open_trajectory_store(f"file://{args.work / 'files'}", f"bench-{mode}")
            stores[("s3", mode)] = open_trajectory_store(
                f"s3://{server.bucket}/weights", f"bench-{mode}", endpoint=server.endpoint
            )
        for lr in [float(x) for x in args.lrs.split(",")]:
            records += train_and_publish(args, model_dir, lr, stores)
    finally:
        server.stop()
        # Every version of every store is a full copy or a chain of deltas of the model: GBs.
        if not args.keep:
            shutil.rmtree(args.work, ignore_errors=True)
    keys = [f"{backend}/{mode}" for backend, mode in stores]
    summary = summarize(records, keys)
    import torch

    from hacrl_core.models.loading import load_policy

    params = sum(p.numel() for p in load_policy(model_dir, dtype=torch.bfloat16)[0].parameters())

    def ratio(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    text = table(
        [
            "lr",
            "store/mode",
            "bf16 changed / step",
            "fp32 changed / step",
            "delta / full",
            "written / full per step",
            "read / full per step (replica)",
            "new replica reads / full",
            "publish s (median)",
            "fetch+apply s (median)",
            "new replica s",
        ],
        [
            [
                f"{s['lr']:g}",
                s["store/mode"],
                f"{s['changed_bf16']:.4f}",
                f"{s['changed_fp32']:.4f}",
                ratio(s["delta_over_full"]),
                ratio(s["written_over_full"]),
                ratio(s["read_over_full"]),
                ratio(s["new_replica_over_full"]),
                f"{s['publish_seconds']:.2f}",
                f"{s['fetch_seconds']:.2f}",
                f"{s['new_replica_seconds']:.2f}",
            ]
            for s in summary
        ],
    )
    per_step = table(
        ["lr", "version", "bf16 changed", "fp32 changed", "delta mode kind", "delta MB", "full MB"],
        [
            [
                f"{r['lr']:g}",
                r["version"],
                f"{r.get('changed_bf16', 0):.4f}",
                f"{r.get('changed_fp32', 0):.4f}",
                r["file/delta"]["kind"],
                f"{r['file/delta']['written'] / 1e6:.2f}",
                f"{r['full_bytes'] / 1e6:.1f}",
            ]
            for r in records
        ],
    )
    print(
        f"\nweights: {params / 1e6:.1f}M parameters ({args.model}), bf16 publish {summary[0]['full_bytes'] / 1e6:.1f} MB; "
        f"{args.steps} AdamW steps per lr, fullPublishEvery {args.full_every} in the delta mode; ratios to a full bf16 publish, "
        f"means over versions 1..{args.steps}\n{text}\n\nper version (file store, delta mode)\n{per_step}"
    )
    load_after = os.popen("uptime").read().strip()
    print(f"load: before {load_before}; after {load_after}")
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    path = save(
        "weights-quick" if args.quick else "weights",
        {
            "settings": settings,
            "parameters": params,
            "table": text,
            "per_version_table": per_step,
            "summary": summary,
            "records": records,
            "load_before": load_before,
            "load_after": load_after,
            "total_seconds": time.perf_counter() - began,
        },
        args.out,
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
