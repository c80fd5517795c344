"""single_turn and benchmark called directly over a loopback stand-in."""

from __future__ import annotations

from typing import Any

import pytest

from miles_lite.errors import (
    ConfigError,
    EngineStatusError,
    GenerateError,
    SampleInvariantError,
    SamplingParamsError,
)
from miles_lite.testing import TextPolicy, TextStandInConfig
from miles_lite.text import single_turn
from miles_lite.text.benchmark import Benchmark
from miles_lite.types import Sample, SampleStatus
from tests.text.conftest import OpenState

pytestmark = pytest.mark.anyio

IMAGE_PROMPT = "<|vision_start|><|image_pad|><|vision_end|>What is 2+3?"


class TinyVisionProcessor:
    """A Qwen2-VL style processor built offline: transformers' image processor (small
    pixel bounds) and the real Qwen3 tokenizer; each ``<|image_pad|>`` becomes one token
    per merged patch, as the real processor expands it."""

    def __init__(self, tokenizer: Any) -> None:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        self.image_processor = Qwen2VLImageProcessorPil(
            min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16
        )
        self.tokenizer = tokenizer

    def __call__(self, *, text: list[str], images: list[Any], return_tensors: str) -> Any:
        out = dict(self.image_processor(images=images, return_tensors=return_tensors))
        merge = self.image_processor.merge_size**2
        (prompt,) = text
        for grid in out["image_grid_thw"]:
            n = int(grid.prod()) // merge
            prompt = prompt.replace("<|image_pad|>", "<|placeholder|>" * n, 1)
        prompt = prompt.replace("<|placeholder|>", "<|image_pad|>")
        ids = self.tokenizer(prompt, add_special_tokens=False, return_tensors=return_tensors)
        return {**out, "input_ids": ids["input_ids"], "attention_mask": ids["attention_mask"]}


@pytest.fixture(scope="module")
def processor(tokenizer: Any) -> TinyVisionProcessor:
    return TinyVisionProcessor(tokenizer)


async def test_text_chat_and_token_prompts(text_state: OpenState, tokenizer: Any) -> None:
    chat = [{"role": "user", "content": "What is 2+3?"}]
    template_ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    template_ids = tokenizer.encode(template_ids, add_special_tokens=False)
    async with text_state() as (state, engine):
        text = await single_turn.generate(state.input(Sample(prompt="What is 2+3?")))
        from_chat = await single_turn.generate(state.input(Sample(prompt=chat)))
        given = await single_turn.generate(state.input(Sample(tokens=list(template_ids))))
    sent = [r["input_ids"] for r in engine.stats.requests]
    assert sent == [
        tokenizer.encode("What is 2+3?", add_special_tokens=False),
        template_ids,
        template_ids,
    ]
    for sample in (text, from_chat, given):
        sample.validate()
        assert sample.status is SampleStatus.COMPLETED
        assert sample.response == "It is \\boxed{5}.<|im_end|>"
        assert sample.tokens[-sample.response_length :] == tokenizer.encode(
            sample.response, add_special_tokens=False
        )
        assert sample.loss_mask == [1] * sample.response_length
        assert len(sample.rollout_log_probs or []) == sample.response_length
    assert len({r["rid"] for r in engine.stats.requests}) == 3


async def test_a_multimodal_prompt_goes_through_the_processor_with_image_data(
    text_state: OpenState, processor: TinyVisionProcessor, tokenizer: Any
) -> None:
    from PIL import Image

    image = Image.new("RGB", (56, 56), (200, 30, 30))
    sample = Sample(prompt=IMAGE_PROMPT, multimodal_inputs={"images": [image]})
    async with text_state(processor=processor) as (state, engine):
        out = await single_turn.generate(state.input(sample))
        with pytest.raises(GenerateError, match="no processor"):
            state.context.processor = None
            await single_turn.generate(
                state.input(Sample(prompt=IMAGE_PROMPT, multimodal_inputs={"images": [image]}))
            )
    (request,) = engine.stats.requests
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    # A 56x56 image is a 4x4 patch grid, merged 2x2: four image tokens in the prompt.
    assert request["input_ids"].count(pad) == 4
    assert request["image_data"][0].startswith("data:image/png;base64,")
    assert out.multimodal_train_inputs is not None
    assert out.multimodal_train_inputs["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert "input_ids" not in out.multimodal_train_inputs
    assert out.tokens[: len(request["input_ids"])] == request["input_ids"]
    out.validate()


async def test_a_prompt_too_long_for_the_context_is_truncated_never_sent(
    text_state: OpenState,
) -> None:
    async with text_state(max_context_len=20) as (state, engine):
        long = await single_turn.generate(state.input(Sample(prompt="word " * 40)))
        # A prompt that fits gets only the room the context leaves.
        short = await single_turn.generate(
            state.input(Sample(prompt="word " * 15), max_new_tokens=64)
        )
    assert long.status is SampleStatus.TRUNCATED
    assert long.status_reason == "prompt_too_long"
    assert long.response_length == 0
    (request,) = engine.stats.requests
    assert request["sampling_params"]["max_new_tokens"] == 20 - len(request["input_ids"])
    assert short.response_length <= 20 - len(request["input_ids"])


async def test_an_aborted_sample_resumes_with_what_is_left_of_its_budget(
    text_state: OpenState,
) -> None:
    policy = TextPolicy(default_length=50, eos=False)
    async with text_state(engine=TextStandInConfig(policy=policy)) as (state, engine):
        first = await single_turn.generate(
            state.input(Sample(prompt="hello", seed=1), max_new_tokens=3)
        )
        # As an early stop leaves it: partial output, ABORTED.
        first.status = SampleStatus.ABORTED
        tokens_then = list(first.tokens)
        resumed = await single_turn.generate(state.input(first, max_new_tokens=8))
        spent = Sample(
            prompt="hello",
            tokens=[1, 2, 3],
            response_length=2,
            loss_mask=[1, 1],
            rollout_log_probs=[-0.1, -0.2],
            status=SampleStatus.ABORTED,
        )
        nothing_left = await single_turn.generate(state.input(spent, max_new_tokens=2))
    _first_request, second_request = engine.stats.requests  # the spent one was never sent
    assert second_request["input_ids"] == tokens_then
    assert second_request["sampling_params"]["max_new_tokens"] == 8 - 3
    assert resumed.status is SampleStatus.TRUNCATED and resumed.response_length == 8
    assert resumed.tokens[: len(tokens_then)] == tokens_then
    assert len(resumed.weight_versions) == 2
    resumed.validate()
    assert nothing_left.status is SampleStatus.TRUNCATED
    assert nothing_left.status_reason == "budget_spent"


async def test_after_an_early_stop_nothing_new_is_sent(text_state: OpenState) -> None:
    async with text_state() as (state, engine):
        state.run.stop.set()
        stopped = await single_turn.generate(state.input(Sample(prompt="What is 2+3?")))
        assert stopped.status is SampleStatus.ABORTED and stopped.response_length == 0
        assert stopped.status_reason == "early_stop"
        assert engine.stats.requests == []
        state.new_run()
        again = await single_turn.generate(state.input(stopped))
    assert len(engine.stats.requests) == 1
    assert again.status is SampleStatus.COMPLETED and again.response.endswith("<|im_end|>")


async def test_bad_sampling_input_is_refused_or_surfaces_sglangs_message(
    text_state: OpenState,
) -> None:
    async with text_state() as (state, engine):
        with pytest.raises(SamplingParamsError, match="'max_tokens'"):
            await single_turn.generate(state.input(Sample(prompt="x"), max_tokens=3))
        assert engine.stats.requests == []  # refused before anything was sent
        with pytest.raises(EngineStatusError) as info:
            await single_turn.generate(state.input(Sample(prompt="x"), temperature="hot"))
    assert info.value.status == 400 and "temperature" in str(info.value)
    assert len(state.run.in_flight) == 0


async def test_benchmark_lengths_are_random_in_range_seeded_and_ignore_eos(
    text_state: OpenState,
) -> None:
    generate = Benchmark(3, 9)
    async with text_state(engine=TextStandInConfig(policy=TextPolicy(default_length=2))) as (
        state,
        engine,
    ):
        samples = [
            await generate(state.input(Sample(prompt="hello", seed=seed)))
            for seed in (*range(12), 5)
        ]
    with pytest.raises(ConfigError, match="min_new_tokens <= max_new_tokens"):
        Benchmark(5, 2)
    asked = [r["sampling_params"]["max_new_tokens"] for r in engine.stats.requests]
    assert all(r["sampling_params"]["ignore_eos"] is True for r in engine.stats.requests)
    assert all(3 <= n <= 9 for n in asked) and len(set(asked)) > 2
    assert asked[-1] == asked[5]  # the same seed, the same length
    # ignore_eos: the engine generates exactly the length asked, past its EOS.
    assert [s.response_length for s in samples] == asked


async def test_a_request_that_never_reached_an_engine_goes_to_another(tokenizer: Any) -> None:
    import socket

    import anyio

    from miles_lite.engine.config import EngineClientConfig, RetryPolicy, RouterConfig
    from miles_lite.engine.http.client import EngineClient
    from miles_lite.engine.router import Router
    from miles_lite.rollout.context import RunContext
    from miles_lite.testing import TextStandInEngine
    from miles_lite.text.context import TextContext
    from tests.text.conftest import RULES, Direct

    with socket.socket() as s:  # a port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    engine = TextStandInEngine(TextStandInConfig(policy=TextPolicy(rules=RULES)), tokenizer)
    await engine.__aenter__()
    retry = RetryPolicy(max_attempts=3, backoff_initial_s=0.01, backoff_max_s=0.02)
    try:
        async with (
            EngineClient(EngineClientConfig(retry=retry)) as client,
            Router([dead, engine.url], client, RouterConfig(max_inflight_per_engine=4)) as router,
        ):
            state = Direct(TextContext(tokenizer=tokenizer, router=router), RunContext(0))
            attempts = 0
            for _ in range(2):  # round robin: one of the two tries the dead engine first
                inp = state.input(Sample(prompt="What is 2+3?"))
                out = await single_turn.generate(inp)
                assert out.status is SampleStatus.COMPLETED
                assert inp.span.engine == engine.url
                attempts += inp.span.requests
    finally:
        with anyio.CancelScope(shield=True):
            await engine.aclose()
    assert len(engine.stats.requests) == 2
    assert attempts in (3, 4)  # refused attempts at the dead engine, retried on the live one


async def test_the_truncation_reason_says_what_ran_out(text_state: OpenState) -> None:
    partial = dict(tokens=list(range(10)), response_length=4, loss_mask=[1] * 4)
    async with text_state(max_context_len=10) as (state, engine):
        full = await single_turn.generate(
            state.input(Sample(status=SampleStatus.ABORTED, **partial))  # type: ignore[arg-type]
        )
        with pytest.raises(SamplingParamsError, match="'max_new_tokens' must be an int >= 0"):
            inp = state.input(Sample(prompt="x"))
            del inp.sampling_params["max_new_tokens"]
            await single_turn.generate(inp)
    assert full.status is SampleStatus.TRUNCATED
    assert full.status_reason == "context_full"
    assert engine.stats.requests == []


def test_each_request_gets_its_own_sampling_params_lists_and_dicts_included() -> None:
    from miles_lite.sglang.sampling import TextSamplingParams
    from miles_lite.text.context import TextContext

    sampling = TextSamplingParams(
        stop=["</s>"], stop_token_ids=[7], extra={"logit_bias": {"3": 1.0}}
    )
    context = TextContext(tokenizer=None, router=None, sampling=sampling)  # type: ignore[arg-type]
    first, second = context.sampling_params(), context.sampling_params()
    first["max_new_tokens"] = 1
    first["stop"].append("x")
    first["stop_token_ids"].append(8)
    first["logit_bias"]["4"] = 2.0
    assert second == context.sampling_params() == sampling.to_payload()
    assert second["stop"] == ["</s>"] and second["stop_token_ids"] == [7]


@pytest.mark.parametrize("bad", [-1, True, None, 2.0, "12", "vocab"])
async def test_given_prompt_ids_are_checked_before_anything_is_sent(
    text_state: OpenState, tokenizer: Any, bad: Any
) -> None:
    vocab = len(tokenizer)
    bad = vocab if bad == "vocab" else bad
    given = [1, 2, bad, 3]
    async with text_state(vocab_size=vocab) as (state, engine):
        with pytest.raises(SampleInvariantError) as info:
            await single_turn.generate(state.input(Sample(index=7, tokens=given)))
        # A good list is sent as a copy: the caller's list is never extended.
        good = [1, 2, 3]
        out = await single_turn.generate(state.input(Sample(tokens=good)))
    assert f"sample 7: prompt ids[2] is {bad!r}, not an id in [0, {vocab})" in str(info.value)
    assert [r["input_ids"] for r in engine.stats.requests] == [good]
    assert good == [1, 2, 3] and out.tokens[:3] == good and out.tokens is not good
    out.validate(vocab_size=vocab)


async def test_a_resumed_sample_is_checked_as_a_whole_before_it_goes_on(
    text_state: OpenState,
) -> None:
    broken = Sample(
        index=3,
        tokens=[1, 2, 3, 4],
        response_length=2,
        loss_mask=[1],  # one entry short
        rollout_log_probs=[-0.5, -0.25],
        status=SampleStatus.ABORTED,
    )
    async with text_state() as (state, engine):
        with pytest.raises(SampleInvariantError, match="sample 3: loss_mask has 1 entries"):
            await single_turn.generate(state.input(broken))
    assert engine.stats.requests == []
