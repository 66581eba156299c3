"""scripts/device-check.sh needs GPUs, so here only its syntax, lint, and the contracts it relies on
are checked: the 2-rank stages run only with 2 or more GPUs and say when they are skipped, and the
rank job it launches accepts the options it passes (docs/real-models.md, "Device check")."""

from __future__ import annotations

import re

from tests.chart.rendering import ROOT

SCRIPT = ROOT / "scripts" / "device-check.sh"
RANK_JOB = ROOT / "tests" / "learner" / "rank_job.py"


def test_two_rank_stages_run_only_with_two_gpus_and_say_when_skipped():
    text = SCRIPT.read_text()
    assert SCRIPT.stat().st_mode & 0o111, "chmod +x scripts/device-check.sh"
    for name in ("multirank", "experiment-2rank"):
        guarded = re.search(
            r"if \(\( GPUS >= 2 \)\); then\n(?:(?!\nfi\n).)*?\nstage "
            + re.escape(name)
            + r" .*?\nelse\nskip_two_ranks "
            + re.escape(name)
            + r"\nfi\n",
            text,
            re.S,
        )
        assert guarded, f"stage {name} must sit in `if (( GPUS >= 2 ))` with `skip_two_ranks {name}` in its else"
    assert 'skipped: $GPUS GPU(s) visible, a 2-rank learner needs 2 or more"' in text
    # The one-GPU stages keep running whatever the count.
    for name in ("install", "models", "experiment"):
        assert re.search(rf"^stage {name} ", text, re.M), name


def test_rank_job_takes_the_options_the_script_passes():
    job = RANK_JOB.read_text()
    for option in ("--model", "--store", "--work", "--steps", "--out", "--checkpoint", "--deepspeed-zero", "--uneven"):
        assert f'"{option}"' in job, option
    script = SCRIPT.read_text()
    assert (
        '"$ROOT/tests/learner/rank_job.py"' in script and "launch_local_ranks(sys.argv[2:], int(sys.argv[1]))" in script
    )
