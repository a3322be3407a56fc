"""lean_rl/tinker/wire.py against the tinker SDK's own converters (tinker 0.38): what the client sends
decodes here, what this encodes the client reads back."""

import numpy as np
import pytest
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import deserialize_forward_backward_output, deserialize_sample_response

from lean_rl.tinker.futures import UserError
from lean_rl.tinker.wire import Sequence, decode_forward_backward, encode_forward_backward_output, encode_sample_response


def _request(data, loss="cross_entropy", config=None, forward_only=False):
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn=loss, loss_fn_config=config),
        model_id="s:train:0", seq_id=3)
    msg = forward_backward_request_to_proto(request)
    msg.forward_only = forward_only
    return msg.SerializeToString()


def _datum(tokens, targets, weights):
    return types.Datum(model_input=types.ModelInput.from_ints(tokens),
                       loss_fn_inputs={"target_tokens": np.array(targets, np.int64),
                                       "weights": np.array(weights, np.float32)})


def test_a_client_request_decodes_with_its_tokens_targets_and_config():
    body = _request([_datum([5, 6, 7], [9, 0, 2], [0.0, 1.0, 0.5]), _datum([1, 2], [3, 4], [1.0, 1.0])],
                    loss="ppo", config={"clip_low_threshold": 0.7})
    call = decode_forward_backward(body)
    assert (call.model_id, call.seq_id, call.loss_fn, call.forward_only) == ("s:train:0", 3, "ppo", False)
    assert call.loss_config == {"clip_low_threshold": pytest.approx(0.7)}
    assert call.data[0].tokens.tolist() == [5, 6, 7]
    assert call.data[0].inputs["target_tokens"].tolist() == [9, 0, 2]  # arbitrary targets, kept as sent
    assert call.data[0].inputs["weights"].tolist() == [0.0, 1.0, 0.5]
    assert call.data[1].tokens.tolist() == [1, 2]


def test_an_input_of_the_wrong_length_is_a_user_error_naming_it():
    with pytest.raises(UserError, match=r"data\[0\].loss_fn_inputs\['weights'\] has 2 values for 3 input tokens"):
        decode_forward_backward(_request([_datum([5, 6, 7], [1, 2, 3], [1.0, 1.0])]))


def test_garbage_is_a_user_error():
    with pytest.raises(UserError, match="not a ForwardBackwardRequest"):
        decode_forward_backward(b"\xff\xff\xff")


def test_forward_backward_output_round_trips_through_the_client():
    out = deserialize_forward_backward_output(encode_forward_backward_output(
        [np.array([-1.5, -0.25, -3.0]), np.array([-0.5])], {"loss:sum": 4.75}))
    assert out.metrics == {"loss:sum": 4.75}
    assert [o["logprobs"].tolist() for o in out.loss_fn_outputs] == [[-1.5, -0.25, -3.0], [-0.5]]


def test_sample_response_round_trips_through_the_client():
    body = encode_sample_response([Sequence([4, 5], [-0.5, -1.0], "length"), Sequence([7], [-2.0], "stop")],
                                  prompt_logprobs=[float("nan"), -3.0])
    out = deserialize_sample_response(body)
    assert [(s.tokens, s.logprobs, s.stop_reason) for s in out.sequences] == [
        ([4, 5], [-0.5, -1.0], "length"), ([7], [-2.0], "stop")]
    assert out.prompt_logprobs == [None, -3.0]  # the client reads NaN as "no log-prob"
