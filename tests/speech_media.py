"""Small real videos for the transcript tests: a sentence spoken by
espeak-ng and a silent one, both MP4 files with an AAC sound track, encoded
with PyAV (it comes with faster-whisper; no ffmpeg program is needed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import av
import numpy as np
import pytest

SENTENCE = "The quick brown fox jumps over the lazy dog."
RATE = 16_000


def _write_mp4(path: Path, frames) -> bytes:
    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream("aac", rate=RATE)
        stream.layout = "mono"
        for frame in frames:
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path.read_bytes()


def speech_mp4(folder: Path, sentence: str = SENTENCE) -> bytes:
    if not shutil.which("espeak-ng"):
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    wav = folder / "speech.wav"
    subprocess.run(["espeak-ng", "-w", str(wav), sentence], check=True, capture_output=True)
    resampler = av.AudioResampler(format="fltp", layout="mono", rate=RATE)
    with av.open(str(wav)) as source:
        frames = [out for frame in source.decode(audio=0) for out in resampler.resample(frame)]
    frames += resampler.resample(None)
    return _write_mp4(folder / "speech.mp4", frames)


def silent_mp4(folder: Path, seconds: float = 3.0) -> bytes:
    frames = []
    for number in range(int(seconds * RATE / 1024)):
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), dtype=np.float32), format="fltp", layout="mono")
        frame.sample_rate, frame.pts = RATE, number * 1024
        frames.append(frame)
    return _write_mp4(folder / "silence.mp4", frames)


@pytest.fixture(scope="session")
def videos(tmp_path_factory) -> dict[str, bytes]:
    folder = tmp_path_factory.mktemp("videos")
    return {"speech": speech_mp4(folder), "silence": silent_mp4(folder)}
