"""The media SGLang offers a weight sync, driven bare (bench/weight_sync.py's second floor of each
transport): the calls SGLang requires, made to the engines under test by the simplest client, with no
export, no Ray and no session bookkeeping of ours. The distributed transport's medium, a gloo broadcast
between bare processes, is floors.GlooFloor."""

from __future__ import annotations

import base64
import http.client
import pickle
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import orjson
import torch

from lean_rl.weight_sync.buckets import iter_buckets


def encoded_buckets(state_dict: dict[str, torch.Tensor], buffer_size: int) -> tuple[list[bytes], float]:
    """(pickle + base64 of every bucket, the seconds that took): the inline payload's bytes."""
    started = time.perf_counter()
    payloads = [base64.b64encode(pickle.dumps(list(zip(bucket.names, bucket.tensors)), protocol=5))
                for bucket, _ in iter_buckets(state_dict.items(), buffer_size)]
    return payloads, time.perf_counter() - started


class BarePosts:
    """A transport's medium as SGLang offers it: the calls SGLang requires, made to the same engines by a
    bare HTTP client (the standard library's: one sendall per body; httpx's synchronous client
    re-slices the unsent rest of a body after every send, which on a 408 MB payload cost more than the
    whole sync), orjson bodies, every engine at once. `once` times `prepare` (the bytes made) and
    every engine's `calls`."""

    def __init__(self, urls: list[str], api_key: str | None, state_dict: dict[str, torch.Tensor]):
        self.urls, self.state_dict = urls, state_dict
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def prepare(self):
        raise NotImplementedError

    def calls(self, prepared) -> list[tuple[str, dict]]:
        raise NotImplementedError

    def _post(self, connection: http.client.HTTPConnection, path: str, body: dict) -> None:
        connection.request("POST", path, body=orjson.dumps(body), headers=self.headers)
        answer = connection.getresponse()
        text = answer.read()
        if answer.status >= 400 or orjson.loads(text).get("success") is False:
            raise RuntimeError(f"{connection.host}:{connection.port}{path}: HTTP {answer.status} {text[:300]!r}")

    def once(self) -> float:
        started = time.perf_counter()
        prepared = self.prepare()
        errors: list[BaseException] = []

        def post_all(url: str) -> None:
            where = urlsplit(url)
            assert where.scheme == "http", f"the bench's engines serve plain HTTP on loopback, not {url}"
            connection = http.client.HTTPConnection(where.hostname, where.port, timeout=1800)
            try:
                for path, body in self.calls(prepared):
                    self._post(connection, path, body)
            except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
                errors.append(err)
            finally:
                connection.close()

        threads = [threading.Thread(target=post_all, args=(url,)) for url in self.urls]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        self.clean_up(prepared)
        return time.perf_counter() - started

    def clean_up(self, prepared) -> None:
        """The round's clean-up, timed as ours' is (the disk transport removes the previous sync's
        directory within its sync)."""

    def close(self) -> None:
        pass


class BareTensorPosts(BarePosts):
    """tensor: the floor's payload (pickle + base64 per bucket), /begin_weight_update, one
    /update_weights_from_tensor per bucket, /end_weight_update."""

    def __init__(self, urls: list[str], api_key: str | None, state_dict: dict[str, torch.Tensor], buffer_size: int):
        super().__init__(urls, api_key, state_dict)
        self.buffer_size = buffer_size

    def prepare(self) -> list[bytes]:
        return encoded_buckets(self.state_dict, self.buffer_size)[0]

    def calls(self, payloads: list[bytes]) -> list[tuple[str, dict]]:
        updates = [("/update_weights_from_tensor", {"serialized_named_tensors": [payload.decode("ascii")],
                                                    "load_format": None, "flush_cache": index == len(payloads) - 1})
                   for index, payload in enumerate(payloads)]
        return [("/begin_weight_update", {}), *updates, ("/end_weight_update", {})]


class BareSession(BarePosts):
    """The session SGLang requires around every tensor or distributed update (0.5.23 rejects them outside
    it), with no weights in it: /begin_weight_update then /end_weight_update, every engine at once. The
    least a streamed sync's fixed overhead can be."""

    def __init__(self, urls: list[str], api_key: str | None):
        super().__init__(urls, api_key, {})

    def prepare(self) -> None:
        return None

    def calls(self, prepared: None) -> list[tuple[str, dict]]:
        return [("/begin_weight_update", {}), ("/end_weight_update", {})]


class BareDiskLoad(BarePosts):
    """disk: the state dict written as one file by safetensors' save_file into a copy of the served
    checkpoint's other files, then /update_weights_from_disk of that directory."""

    def __init__(self, urls: list[str], api_key: str | None, state_dict: dict[str, torch.Tensor], served: Path,
                 directory: Path):
        super().__init__(urls, api_key, state_dict)
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        for item in served.iterdir():
            if item.is_file() and not item.name.endswith((".safetensors", ".index.json")):
                shutil.copy2(item, directory / item.name)

    def prepare(self) -> Path:
        from safetensors.torch import save_file

        path = self.directory / "model.safetensors"
        save_file(self.state_dict, str(path), metadata={"format": "pt"})
        return path

    def calls(self, path: Path) -> list[tuple[str, dict]]:
        return [("/update_weights_from_disk", {"model_path": str(self.directory), "flush_cache": True})]

    def clean_up(self, path: Path) -> None:
        path.unlink()


@dataclass(frozen=True)
class EnginesServing:
    """What the bare media need of the engines under test."""

    urls: list[str]
    api_key: str | None
    served: Path  # the checkpoint they serve (its config and tokenizer files)
