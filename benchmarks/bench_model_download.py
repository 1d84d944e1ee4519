"""The download of a model file (kb/models/files.py fetch()) from a loopback
hub: kb's own httpx code of an earlier commit against hf_hub_download.

    .venv/bin/python benchmarks/bench_model_download.py [--mb 200] [--runs 5] [--before 4f1f0d3]

The hub is tests/fake_hf_hub.py: HEAD and GET of /<repo>/resolve/<revision>/<path>,
a 302 to another host name (the CDN), then the bytes. Each run downloads
the file into a new folder and checks its sha256, as locate() does.
`--before` names the commit whose kb/models/files.py is the "before"
(kb's httpx code). Figures (median seconds and MB/s) go into
benchmarks/libraries.md with the machine's load.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def load_files_module(commit: str | None):
    """kb/models/files.py of `commit`, or of the work tree."""
    if commit is None:
        from kb.models import files

        return files
    text = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:kb/models/files.py"],
                          check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp(prefix="kb-bench-")) / "files_before.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("files_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["files_before"] = module  # dataclasses look the module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--before", default=None, help="the commit of kb's own download code")
    args = parser.parse_args()

    os.environ["HF_HUB_OFFLINE"] = "0"
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import huggingface_hub
    import huggingface_hub.constants

    huggingface_hub.constants.HF_HUB_OFFLINE = False
    from kb.models.catalog import Model, ModelFile
    from tests.fake_hf_hub import FakeHub

    data = os.urandom(args.mb * 1024 * 1024)
    model = Model(key="bench", role="a benchmark", repo="owner/bench", revision="b" * 40,
                  files=(ModelFile("model.onnx", hashlib.sha256(data).hexdigest(), len(data),
                                   published="onnx/model.onnx"),))
    route = f"/{model.repo}/resolve/{model.revision}/onnx/model.onnx"
    versions = {"hf_hub_download (work tree)": load_files_module(None)}
    if args.before:
        versions[f"kb httpx code ({args.before})"] = load_files_module(args.before)
    with FakeHub({route: data}) as hub:
        os.environ["HF_ENDPOINT"] = hub.base_url
        load = os.getloadavg()
        print(f"load: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; huggingface_hub {huggingface_hub.__version__}; "
              f"{args.mb} MB, median of {args.runs} runs")
        times = {name: [] for name in versions}
        for _ in range(args.runs):
            for name, files in versions.items():  # in turns: a change of the load hits both
                folder = Path(tempfile.mkdtemp(prefix="kb-bench-dl-"))
                start = time.perf_counter()
                files.fetch(model, folder)
                files.verify(model, folder)
                times[name].append(time.perf_counter() - start)
        for name, times in times.items():
            median = statistics.median(times)
            print(f"{name:32s} {median:6.2f} s  {args.mb / median:7.1f} MB/s  (min {min(times):.2f}, max {max(times):.2f})")


if __name__ == "__main__":
    main()
