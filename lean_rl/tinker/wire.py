"""Tinker's protobuf bodies (the SDK's own generated tinker_public_pb2, tinker 0.38): the
forward_backward request in, ForwardBackwardOutput and SampleResponse out (0.38 reads those two only as
protobuf). Everything else on the wire is JSON (server.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

from lean_rl.tinker.futures import UserError

_DTYPES = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


@dataclass
class Datum:
    tokens: np.ndarray  # [N] int64: the model input
    inputs: dict[str, np.ndarray] = field(default_factory=dict)  # loss_fn_inputs by name, each [N]


@dataclass
class ForwardBackwardCall:
    model_id: str
    seq_id: int
    loss_fn: str
    loss_config: dict[str, float]
    forward_only: bool
    data: list[Datum]


def _tensor(name: str, msg) -> np.ndarray:
    dtype = _DTYPES.get(msg.dtype)
    if dtype is None:
        raise UserError(f"loss_fn_inputs[{name!r}]: dtype {pb.DType.Name(msg.dtype)} is not supported "
                        "(float32, int64, int32)")
    if msg.HasField("sparse_csr"):
        raise UserError(f"loss_fn_inputs[{name!r}]: sparse (CSR) tensors are not supported by this server; "
                        "send dense 1-D tensors")
    array = np.frombuffer(msg.dense, dtype=dtype)
    shape = tuple(msg.shape) or (array.size,)
    if len(shape) != 1 or int(np.prod(shape)) != array.size:
        raise UserError(f"loss_fn_inputs[{name!r}]: shape {list(shape)} is not supported (1-D, one value per "
                        "input token)")
    return array.reshape(shape)


def _tokens(datum_msg, index: int) -> np.ndarray:
    parts = []
    for chunk in datum_msg.model_input:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise UserError(f"data[{index}].model_input: {kind} chunks are not supported (text tokens only)")
        parts.append(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32))
    tokens = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    if tokens.size == 0:
        raise UserError(f"data[{index}].model_input is empty")
    return tokens


def decode_forward_backward(body: bytes) -> ForwardBackwardCall:
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as err:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise UserError(f"forward_backward: the body is not a ForwardBackwardRequest protobuf ({err})") from None
    config = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for key, value in msg.loss_fn_config_v2.items():
        if value.WhichOneof("value") == "text":
            raise UserError(f"loss_fn_config[{key!r}]: text values are not supported")
        config[key] = float(value.number)
    data = []
    for index, datum_msg in enumerate(msg.data):
        tokens = _tokens(datum_msg, index)
        inputs = {name: _tensor(name, tensor) for name, tensor in datum_msg.loss_fn_inputs.items()}
        for name, array in inputs.items():
            if array.shape[0] != tokens.shape[0]:
                raise UserError(f"data[{index}].loss_fn_inputs[{name!r}] has {array.shape[0]} values for "
                                f"{tokens.shape[0]} input tokens")
        data.append(Datum(tokens, inputs))
    if not data:
        raise UserError("forward_backward: no data")
    return ForwardBackwardCall(msg.model_id, int(msg.seq_id), msg.loss_fn, config, bool(msg.forward_only), data)


def encode_forward_backward_output(logprobs: list[np.ndarray], metrics: dict[str, float]) -> bytes:
    """Per datum {"logprobs": [N] float32}; metrics named `name:reduction` (the client splits on ':')."""
    arrays = [np.asarray(lp, dtype=np.float32).reshape(-1) for lp in logprobs]
    offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
    record = pb.ArrayRecord(type_tag="ArrayRecord", num_datums=len(arrays))
    record.fields["logprobs"].CopyFrom(pb.BatchedTensor(
        data=b"".join(a.tobytes() for a in arrays), offsets=offsets.tobytes(), dtype=pb.DTYPE_FLOAT32))
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics=metrics)
    out.loss_fn_outputs.append(record)
    return out.SerializeToString()


@dataclass
class Sequence:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str  # "stop" | "length"


def encode_sample_response(sequences: list[Sequence], prompt_logprobs: list[float] | None = None) -> bytes:
    out = pb.SampleResponse()
    for seq in sequences:
        out.sequences.append(pb.SampledSequence(
            stop_reason=pb.STOP_REASON_LENGTH if seq.stop_reason == "length" else pb.STOP_REASON_STOP,
            tokens=np.asarray(seq.tokens, dtype=np.int32).tobytes(),
            logprobs=np.asarray(seq.logprobs, dtype=np.float32).tobytes()))
    if prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    return out.SerializeToString()
