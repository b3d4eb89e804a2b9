"""Moonshine's float graphs (voiceagent/moonshine_graph.py): the dequantisation chains folded exactly, the
weight MatMuls of the int8 decoder on the weights' own grid, the rebuilt files checked by sha256, and, on
the real model, the same numbers and the same transcript as the shipped `.ort` graphs (the int8 decoder:
the same transcripts)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import pytest

from voiceagent import moonshine, moonshine_graph
from voiceagent.audio import to_float
from voiceagent.moonshine import (
    MODEL_NAME,
    START_TOKEN,
    MoonshineModel,
    MoonshineRecognizer,
    load_moonshine,
)
from voiceagent.moonshine_graph import (
    FLOAT,
    INT8,
    INT8_BLOCK,
    MoonshineGraphError,
    check_float_graphs,
    float_graphs,
    fold_dequantize_chains,
    int8_grids,
    int8_matmuls,
    name_subgraphs,
    onnx_message,
    ort_graphs,
    tensor_array,
)
from voiceagent.real_speech import load_clips
from voiceagent.speech_models import prepare_speech_model
from voiceagent.stages import PartialStopped


def tensor(name: str, array: np.ndarray) -> Any:
    proto = onnx_message("TensorProto")(name=name, data_type=INT8 if array.dtype == np.int8 else FLOAT)
    proto.dims.extend(array.shape)
    proto.raw_data = array.tobytes()
    return proto


def node(op_type: str, inputs: list[str], outputs: list[str], name: str = "") -> Any:
    made = onnx_message("NodeProto")(op_type=op_type, name=name)
    made.input.extend(inputs)
    made.output.extend(outputs)
    return made


def dequantizing_graph(quantized: np.ndarray, scale: float, offset: float) -> Any:
    """w = float(q) * scale + offset, read by a MatMul inside an If's branch; an unrelated initializer."""
    graph = onnx_message("GraphProto")(name="main")
    graph.initializer.extend([
        tensor("w_q", quantized), tensor("w_scale", np.array([scale], np.float32)),
        tensor("w_offset", np.array([offset], np.float32)), tensor("bias", np.ones(3, np.float32)),
    ])  # fmt: skip
    graph.node.extend([
        node("Cast", ["w_q"], ["w_cast"]), node("Mul", ["w_cast", "w_scale"], ["w_mul"]),
        node("Add", ["w_mul", "w_offset"], ["w"]), node("Add", ["x", "bias"], ["x1"]),
    ])  # fmt: skip
    branch = onnx_message("GraphProto")()
    branch.node.append(node("MatMul", ["x1", "w"], ["y"]))
    if_node = node("If", ["cond"], ["y"], name="optimum::if")
    if_node.attribute.append(onnx_message("AttributeProto")(name="then_branch", g=branch))
    graph.node.append(if_node)
    return graph


def test_a_dequantisation_chain_becomes_its_float_weight_and_its_initializers_go() -> None:
    quantized = np.array([[-128, 0, 127], [5, -7, 1]], np.int8)
    scale, offset = 0.0391, 0.7832  # float32-rounded below, as the graph's Mul and Add round
    graph = dequantizing_graph(quantized, scale, offset)
    assert fold_dequantize_chains(graph) == 1
    assert [n.op_type for n in graph.node] == ["Add", "If"]  # the chain's three nodes are gone
    weights = {t.name: tensor_array(t) for t in graph.initializer}
    assert sorted(weights) == ["bias", "w"]  # "w" is read from inside the branch: it is kept, as a float
    expected = quantized.astype(np.float32) * np.float32(scale) + np.float32(offset)
    assert weights["w"].dtype == np.float32 and np.array_equal(weights["w"], expected)


def test_the_branches_get_the_names_onnx_requires() -> None:
    graph = dequantizing_graph(np.zeros((2, 3), np.int8), 1.0, 0.0)
    name_subgraphs(graph, "decoder_model_merged")
    assert graph.node[-1].attribute[0].g.name == "decoder_model_merged/optimum::if/then_branch"


def weight_matmuls_graph(quantized: np.ndarray, scale: float, offset: float) -> Any:
    """The dequantising graph, its branch reading the weight three more ways: through a Transpose, and by a
    MatMul over the encoder's states."""
    graph = dequantizing_graph(quantized, scale, offset)
    branch = graph.node[-1].attribute[0].g
    transpose = node("Transpose", ["w"], ["w_t"])
    transpose.attribute.append(onnx_message("AttributeProto")(name="perm", ints=[1, 0]))
    branch.node.extend([transpose, node("MatMul", ["y", "w_t"], ["logits"]),
                        node("MatMul", ["encoder_hidden_states", "w"], ["keys"])])  # fmt: skip
    return graph


def nbits_weight(graph: Any, matmul: Any) -> np.ndarray:
    """A MatMulNBits node's weight [K, N] as its kernel reads it: (B - zero point) * scale, block by block."""
    attributes = {a.name: a.i for a in matmul.attribute}
    k, n = attributes["K"], attributes["N"]
    initializers = {t.name: tensor_array(t) for t in graph.initializer}
    b, scales, zero_points = (initializers[name] for name in matmul.input[1:])
    assert b.size == n * k and scales.size == zero_points.size == n * k // attributes["block_size"]
    blocks = b.reshape(n * k // attributes["block_size"], -1).astype(np.float32)
    dequantized = (blocks - zero_points[:, None].astype(np.float32)) * scales[:, None]
    return dequantized.reshape(n, k).T


def test_the_int8_decoder_multiplies_by_the_same_weights_on_their_own_grid() -> None:
    """A weight shipped as q * scale + offset (offset a whole number of steps) becomes MatMulNBits' B, scale
    and zero point with the same values: for its MatMul and for the MatMul through its Transpose (as the
    logits read the embedding). The MatMul over the encoder's states stays float, and so does the weight
    it reads; the Transpose nothing reads any more goes."""
    rng = np.random.default_rng(0)
    quantized = rng.integers(-128, 128, size=(2 * INT8_BLOCK, INT8_BLOCK), dtype=np.int8)  # [K, N]
    scale = np.float32(0.0123)
    offset = np.float32(-21 * scale)
    graph = weight_matmuls_graph(quantized, float(scale), float(offset))
    grids = int8_grids(graph)
    fold_dequantize_chains(graph)
    folded = {t.name: tensor_array(t) for t in graph.initializer}["w"]
    assert int8_matmuls(graph, grids) == 2
    branch = graph.node[-1].attribute[0].g
    assert [n.op_type for n in branch.node] == ["MatMulNBits", "MatMulNBits", "MatMul"]
    plain, logits, keys = branch.node
    attributes = {a.name: a.i for a in plain.attribute}
    assert attributes == {"K": 64, "N": 32, "bits": 8, "block_size": INT8_BLOCK, "accuracy_level": 4}
    assert plain.domain == "com.microsoft" and plain.input[0] == "x1" and list(plain.output) == ["y"]
    assert np.allclose(nbits_weight(graph, plain), folded, rtol=0, atol=1e-6)
    assert np.allclose(nbits_weight(graph, logits), folded.T, rtol=0, atol=1e-6)
    assert keys.input[:] == ["encoder_hidden_states", "w"] and "w" in {t.name for t in graph.initializer}


def test_a_weight_off_a_whole_step_grid_stays_float() -> None:
    graph = weight_matmuls_graph(np.ones((INT8_BLOCK, 4), np.int8), 0.5, 0.3)  # 0.6 of a step
    assert int8_grids(graph) == {}
    odd_k = weight_matmuls_graph(np.ones((INT8_BLOCK + 1, INT8_BLOCK + 1), np.int8), 0.5, 1.0)
    grids = int8_grids(odd_k)
    fold_dequantize_chains(odd_k)
    assert int8_matmuls(odd_k, grids) == 0  # K not a whole number of blocks


def fake_float_graphs(tmp_path: Path) -> Path:
    """A prepared-model folder with stand-in `.ort` files and a matching float build beside it."""
    source = tmp_path / "moonshine"
    built = tmp_path / "moonshine-float"
    source.mkdir()
    built.mkdir()
    files, sources = {}, {}
    for name in moonshine_graph.GRAPH_FILES:
        (source / f"{name}.ort").write_bytes(f"ort {name}".encode())
        sources[name] = hashlib.sha256(f"ort {name}".encode()).hexdigest()
    for name in moonshine_graph.BUILT_FILES:
        (built / f"{name}.onnx").write_bytes(f"onnx {name}".encode())
        files[name] = {
            "size": len(f"onnx {name}"),
            "sha256": hashlib.sha256(f"onnx {name}".encode()).hexdigest(),
        }
    manifest = {"format_version": moonshine_graph.FORMAT_VERSION, "sources": sources, "files": files}
    (built / moonshine_graph.MANIFEST).write_text(json.dumps(manifest))
    return source


def test_a_built_float_graph_is_used_as_built_and_a_damaged_one_is_refused(tmp_path: Path) -> None:
    source = fake_float_graphs(tmp_path)
    graphs = float_graphs(source)  # found and checked: nothing rebuilt (these stand-ins could not be)
    assert graphs.decoder == tmp_path / "moonshine-float" / "decoder_model_merged.onnx"
    assert graphs.int8_decoder == tmp_path / "moonshine-float" / "decoder_model_merged.int8.onnx"
    manifest = moonshine_graph.manifest_of(source)
    assert manifest is not None
    for damaged in (graphs.decoder, graphs.int8_decoder):
        intact = damaged.read_bytes()
        damaged.write_bytes(intact + b", but damaged")
        with pytest.raises(MoonshineGraphError, match="damaged"):
            check_float_graphs(source, manifest)
        damaged.write_bytes(intact)


def test_other_source_graphs_are_not_taken_for_the_built_ones(tmp_path: Path) -> None:
    source = fake_float_graphs(tmp_path)
    (source / "encoder_model.ort").write_bytes(b"another encoder")
    assert moonshine_graph.manifest_of(source) is None  # float_graphs would rebuild


# ----- the real model -----------------------------------------------------------------------------------
def same_kernel_session(path: Path) -> onnxruntime.InferenceSession:
    """No graph optimisation and no prepacked weights: both graphs then run the very same kernels."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.add_session_config_entry("session.disable_prepacking", "1")
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def first_logits(graphs: moonshine_graph.MoonshineGraphs, audio: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The encoder's states and the logits of the first two decoder steps (greedy)."""
    encoder, decoder = same_kernel_session(graphs.encoder), same_kernel_session(graphs.decoder)
    hidden = encoder.run(None, {"input_values": audio[np.newaxis]})[0]
    past_names = [i.name for i in decoder.get_inputs() if i.name.startswith("past_key_values")]
    past = {name: np.zeros((1, 8, 0, 52), np.float32) for name in past_names}
    token, logits = START_TOKEN, []
    for step in range(2):
        inputs = {"input_ids": np.array([[token]]), "encoder_hidden_states": hidden}
        out, *present = decoder.run(None, {**inputs, "use_cache_branch": np.array([step > 0]), **past})
        past = dict(zip(past_names, present, strict=True)) if step == 0 else past
        token = int(out[0, -1].argmax())
        logits.append(out)
    return hidden, np.stack(logits)


@pytest.mark.bundled
def test_the_float_graphs_compute_exactly_what_the_shipped_graphs_compute() -> None:
    directory = prepare_speech_model(MODEL_NAME)
    audio = to_float(load_clips(("cards-003",), log=lambda _: None)[0].audio)
    reference_hidden, reference_logits = first_logits(ort_graphs(directory), audio)
    hidden, logits = first_logits(float_graphs(directory), audio)
    assert np.array_equal(hidden, reference_hidden)  # bit for bit: the same weights
    assert np.array_equal(logits, reference_logits)


@pytest.mark.bundled
def test_the_fast_path_hears_a_real_clip_as_the_reference_path_does() -> None:
    """The session's model (float graphs, int8 decoder, onnxruntime's optimisations) against the shipped
    graphs."""
    directory = prepare_speech_model(MODEL_NAME)
    reference = MoonshineModel(ort_graphs(directory), directory / "tokenizer.json")
    fast = load_moonshine()
    clip = load_clips(("arctic-a0009",), log=lambda _: None)[0]
    audio = to_float(clip.audio)
    tokens = fast.greedy_tokens(fast.encode(audio), 40)
    assert tokens == reference.greedy_tokens(reference.encode(audio), 40)
    assert fast.transcribe(audio) == "He turned sharply and faced Gregson across the table."


def softmax(logits: np.ndarray) -> np.ndarray:
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


@pytest.mark.bundled
def test_the_int8_decoder_hears_real_speech_as_the_float_decoder_does() -> None:
    """On the same encoder states, greedy decoding picks the same tokens, and every row of a drafted call's
    logits has the same top token, its probabilities within 3 points (measured: 1.4 at most over the 13 real
    clips; the logits within 0.36 of ranges ~25-35)."""
    directory = prepare_speech_model(MODEL_NAME)
    graphs = float_graphs(directory)
    exact = MoonshineModel(graphs, directory / "tokenizer.json", decoder="float")
    int8 = MoonshineModel(graphs, directory / "tokenizer.json", decoder="int8")
    assert (exact.decoder_kind, int8.decoder_kind) == ("float", "int8")
    clips = load_clips(
        ("jfk", "librivox-0890", "cards-002", "arctic-a0009", "librivox-0880"), log=lambda _: None
    )
    for clip in clips:
        hidden = exact.encode(to_float(clip.audio))
        tokens = exact.greedy_tokens(hidden, 60)
        assert int8.greedy_tokens(hidden, 60) == tokens, clip.name
        float_rows = exact.decode(hidden, exact.empty_cache(), [START_TOKEN, *tokens])
        int8_rows = int8.decode(hidden, int8.empty_cache(), [START_TOKEN, *tokens])
        assert np.array_equal(float_rows.argmax(axis=-1), int8_rows.argmax(axis=-1)), clip.name
        assert np.abs(softmax(float_rows) - softmax(int8_rows)).max() < 0.03, clip.name
        assert np.abs(float_rows - int8_rows).max() < 1.0, clip.name


def stepping(*times_ms: float) -> Any:
    """A stand-in for `MoonshineModel.step_ms` that gives `times_ms` in turn."""
    times = iter(times_ms)
    return lambda self: next(times)


@pytest.mark.bundled
def test_the_int8_decoder_is_kept_where_its_step_is_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    """The load-time probe: here the int8 step is fast and kept without timing the float one; an int8 step
    over COMPARE_ABOVE_MS has the float decoder timed too, and the faster kept (a CPU without fast int8
    kernels); the shipped graphs have no int8 decoder."""
    directory = prepare_speech_model(MODEL_NAME)
    graphs = float_graphs(directory)
    tokenizer = directory / "tokenizer.json"
    chosen = MoonshineModel(graphs, tokenizer)
    assert chosen.decoder_kind == "int8" and list(chosen.probe_step_ms) == ["int8"]
    assert chosen.probe_step_ms["int8"] < moonshine.COMPARE_ABOVE_MS
    for int8_ms, float_ms, kept, path in (
        (150.0, 14.0, "float", graphs.decoder),
        (20.0, 30.0, "int8", graphs.int8_decoder),
    ):
        monkeypatch.setattr(MoonshineModel, "step_ms", stepping(int8_ms, float_ms))
        model = MoonshineModel(graphs, tokenizer)
        assert model.decoder_kind == kept and model.decoder._model_path == str(path)
        assert model.probe_step_ms == {"int8": int8_ms, "float": float_ms}
    assert MoonshineModel(ort_graphs(directory), tokenizer).decoder_kind == "float"
    with pytest.raises(ValueError, match="no int8 decoder"):
        MoonshineModel(ort_graphs(directory), tokenizer, decoder="int8")


@pytest.mark.bundled
def test_a_pass_says_how_sure_it_was_of_its_words() -> None:
    """The least probability of a pass's picks: high for clear speech, the same with a draft (whose
    batched logits match a step's: to ~2e-5 in float, within a point in the int8 decoder, whose one-row
    kernel sums in another order: 0.3 measured), and low for sounds that are not words (the speech
    reversed)."""
    model = load_moonshine()
    audio = to_float(load_clips(("arctic-a0009",), log=lambda _: None)[0].audio)
    tokens, confidence = model.heard(audio)
    assert tokens == model.heard_tokens(audio) and confidence is not None and 0.25 < confidence <= 1.0
    drafted, with_draft = model.heard(audio, tokens[:-2])
    assert drafted == tokens and with_draft == pytest.approx(confidence, abs=0.01)
    garbled, unsure = model.heard(np.ascontiguousarray(audio[::-1]))
    assert garbled and unsure is not None and unsure < confidence and unsure < 0.25
    assert model.heard(audio[:100]) == ([], None)  # too little audio to hear anything


class CountingDecoder:
    """Wraps an onnxruntime session: counts its runs."""

    def __init__(self, session: onnxruntime.InferenceSession) -> None:
        self.session, self.runs = session, 0

    def run(self, outputs: None, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        self.runs += 1
        return self.session.run(outputs, inputs)


@pytest.mark.bundled
def test_a_draft_changes_the_cost_of_a_pass_not_its_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """A right draft costs one decoder call; one from less audio, a wrong one, or one too long give the same
    tokens as no draft at all."""
    model = load_moonshine()
    audio = to_float(load_clips(("librivox-0880",), log=lambda _: None)[0].audio)
    plain = model.heard_tokens(audio)
    counting = CountingDecoder(model.decoder)
    monkeypatch.setattr(model, "decoder", counting)
    assert model.heard_tokens(audio, plain) == plain and counting.runs == 1  # all accepted, then the end
    earlier = model.heard_tokens(audio[:-8000])  # a partial's, 0.5 s before the end
    assert earlier != plain
    wrong = [plain[0], *reversed(plain[1:])]
    for draft in (earlier, wrong, plain + plain, plain[:3]):
        counting.runs = 0
        assert model.heard_tokens(audio, draft) == plain
        accepted = next(i for i, (a, b) in enumerate(zip([*draft, -1], [*plain, -1], strict=False)) if a != b)
        assert counting.runs == 1 + max(0, len(plain) - accepted)  # a step for each token after those


def pushed(recognizer: MoonshineRecognizer, audio: np.ndarray) -> None:
    """`audio` [n] int16 pushed in 20 ms frames (the last partial frame left out)."""
    for start in range(0, audio.size - 319, 320):
        recognizer.push(audio[start : start + 320])


@pytest.mark.bundled
def test_a_stopped_partial_ends_at_its_next_decoder_call_and_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`stop_partial` while a pass decodes (voiceagent/partials.py: a partial that could not end the turn,
    stopped for the pause partial): the pass raises `PartialStopped` at its next decoder call, and the next
    partial hears what it would have heard had that one never begun, sooner (the tokens the stopped pass
    decoded are its draft). With no pass decoding, it does nothing."""
    model = load_moonshine()
    audio = load_clips(("librivox-0880",), log=lambda _: None)[0].audio
    stopped, plain = MoonshineRecognizer(model), MoonshineRecognizer(model)
    half = audio.size // 2
    for recognizer in (stopped, plain):
        recognizer.start()
        pushed(recognizer, audio[:half])
        recognizer.stop_partial()  # none decoding: no effect
        recognizer.decode_partial()  # a draft for the next pass, which steps on past it
        pushed(recognizer, audio[half:])
    calls = []
    decode = model.decode

    def decode_then_stop(*args: Any) -> np.ndarray:
        calls.append(args)
        logits = decode(*args)
        stopped.stop_partial()
        return logits

    monkeypatch.setattr(model, "decode", decode_then_stop)
    with pytest.raises(PartialStopped):
        stopped.decode_partial()
    assert len(calls) == 1, "the pass went on past the stop"
    monkeypatch.undo()
    counting = CountingDecoder(model.decoder)
    monkeypatch.setattr(model, "decoder", counting)
    after = stopped.decode_partial()
    runs_after, counting.runs = counting.runs, 0
    expected = plain.decode_partial()
    assert (after.stable, after.text) == (expected.stable, expected.text) and expected.text
    assert runs_after < counting.runs, "the stopped pass's tokens are the next one's draft"


class ScriptedModel:
    """A stand-in for MoonshineModel: each pass (any audio) returns the next of `texts`."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = iter(texts)

    def heard_tokens(self, audio: np.ndarray, draft: Any = ()) -> list[int]:
        return [len(audio)]

    def heard(self, audio: np.ndarray, draft: Any = (), stop: Any = None) -> tuple[list[int], float | None]:
        return self.heard_tokens(audio, draft), 0.9

    def text_of(self, tokens: Any) -> str:
        return next(self.texts)


def test_a_pass_that_reads_the_stable_words_as_fewer_keeps_the_words_after_them() -> None:
    """Seen on `voiceagent bench`: the late pause partial read "for my new puppy" as "for Manu Perpi", and
    the final (stable words + that pass's words past them) lost "puppy"."""
    texts = [
        "Could you suggest a name for my new purpose?",
        "Could you suggest a name for my new puppy?",
        "Could you suggest a name for Manu Perpi?",
    ]
    recognizer = MoonshineRecognizer(ScriptedModel(texts))  # type: ignore[arg-type]
    recognizer.start()
    for _ in range(60):
        recognizer.push(np.zeros(320, dtype=np.int16))
    first = recognizer.decode_partial()
    assert first.stable == "" and first.audio is not None and first.audio.size == 60 * 320  # what it heard
    assert first.confidence == 0.9  # the pass's own, for the turn-taking policy
    assert recognizer.decode_partial().stable == "Could you suggest a name for my new"
    assert recognizer.decode_partial().text == "Could you suggest a name for my new puppy?"


def test_the_decoder_can_be_chosen_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VOICEAGENT_MOONSHINE_DECODER", raising=False)
    assert moonshine.decoder_from_environment() == "auto"
    for kind in ("auto", "int8", "float"):
        monkeypatch.setenv("VOICEAGENT_MOONSHINE_DECODER", kind)
        assert moonshine.decoder_from_environment() == kind
    monkeypatch.setenv("VOICEAGENT_MOONSHINE_DECODER", "fp16")
    with pytest.raises(ValueError, match="expected one of auto, int8, float"):
        moonshine.decoder_from_environment()
