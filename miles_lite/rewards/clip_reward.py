"""A PickScore-style CLIP reward: how well each generated image matches its prompt."""

from __future__ import annotations

import copy
import os
from typing import TYPE_CHECKING, Any, cast

from miles_lite.errors import ConfigError, RewardError

if TYPE_CHECKING:
    import torch
    from transformers import (
        CLIPConfig,
        CLIPModel,
        CLIPTextConfig,
        CLIPVisionConfig,
        PreTrainedTokenizerBase,
    )

    from miles_lite.types import Sample

__all__ = ["CLIP_MEAN", "CLIP_STD", "ClipReward"]

#: The RGB mean and standard deviation CLIP (and PickScore) normalize images with.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class ClipReward:
    """Score samples by CLIP image-text similarity, as PickScore does.

    ``score = logit_scale.exp() * cos(text_embeds, image_embeds)``: the text embedding of
    ``sample.prompt`` against the image embedding of ``sample.generated_output``, both from
    transformers' ``CLIPModel`` (``get_text_features`` / ``get_image_features``). One float
    per sample; with PickScore's ``logit_scale`` (100) scores lie in about [-100, 100].

    Build it from a checkpoint or, for tests and demos, from a config::

        reward = ClipReward(model_path="/ckpt/PickScore_v1", tokenizer="/ckpt/CLIP-ViT-H-14")
        config, tok_dir = tiny_clip(tmp)  # miles_lite.rewards.tiny_clip
        reward = ClipReward(config=config, tokenizer=tok_dir, seed=0)

    ``model_path`` is loaded with ``CLIPModel.from_pretrained``; ``config`` builds
    ``CLIPModel(config)`` with the weights ``torch.manual_seed(seed)`` gives (the global RNG
    is saved and restored around it). The tokenizer is ``tokenizer`` when given (a folder
    for ``CLIPTokenizerFast.from_pretrained``, or a tokenizer object), else ``model_path``.
    (PickScore's checkpoint has no tokenizer files: point ``tokenizer`` at its processor,
    ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K``.)

    Images (``sample.generated_output``, a torch tensor, any float dtype or uint8):

    - SGLang's layout: ``[C, F, H, W]`` is ``F`` frames (``F`` = 1 is one image, as in the
      real capture's ``[3, 1, H, W]``), ``[1, C, F, H, W]`` the same with a batch axis;
      ``[C, H, W]`` is one image. A video scores the **mean of its frame scores**.
    - ``C`` = 3 is RGB. Float values are read in ``value_range`` ((0, 1) by default; pass
      ``(-1, 1)`` for raw VAE decoder output), uint8 in [0, 255]; values are clamped to it.
    - ``C`` != 3 is a stand-in convenience, not a real image: channels ``[0, 1, 2]`` are
      taken modulo ``C`` (the first three of 4-channel latents; a gray image repeated), so
      the stand-in engine's latents score deterministically. A real pipeline sends RGB.
    - Preprocessing in torch, as CLIP's image processor: resize the short side to the
      model's ``image_size`` (bicubic, antialiased), center crop a square, normalize with
      ``image_mean``/``image_std``. Not bit-identical to the PIL path, close to it.

    Text: ``sample.prompt`` must be a string; it is truncated to the model's text length.

    Every call runs one batched forward pass under ``torch.inference_mode()`` (each distinct
    prompt encoded once). The instance pickles only its options (config/path, about 2 KB,
    never weights) and loads the model on its first call, keeping it on the instance. So a
    reward pool should send it to each worker once (an initializer argument) and call that
    resident copy: it loads once per worker. Submitting the instance with every call works
    too, but each unpickled copy starts unloaded and loads again. Threads: whatever
    ``torch.set_num_threads`` the worker set; nothing global is changed at import or load.
    """

    def __init__(
        self,
        *,
        model_path: str | os.PathLike[str] | None = None,
        config: CLIPConfig | None = None,
        tokenizer: str | os.PathLike[str] | PreTrainedTokenizerBase | None = None,
        seed: int = 0,
        value_range: tuple[float, float] = (0.0, 1.0),
        image_mean: tuple[float, float, float] = CLIP_MEAN,
        image_std: tuple[float, float, float] = CLIP_STD,
        device: str = "cpu",
        dtype: str = "float32",
    ) -> None:
        """Record the options; nothing is loaded until the first call (or :meth:`load`).

        Raises ``ConfigError`` unless exactly one of ``model_path``/``config`` is given, if
        ``config`` comes without ``tokenizer``, if ``value_range`` is not ``(low, high)``
        with ``low < high``, if ``image_std`` has a value <= 0, or if ``dtype`` is not a
        floating torch dtype name (``"float32"``, ``"bfloat16"``, ...).
        """
        if (model_path is None) == (config is None):
            raise ConfigError(
                "ClipReward needs exactly one of model_path= (a checkpoint folder) and "
                f"config= (a CLIPConfig); got model_path={model_path!r}, config="
                f"{'a CLIPConfig' if config is not None else None}"
            )
        if config is not None and tokenizer is None:
            raise ConfigError(
                "ClipReward(config=...) needs tokenizer= (a folder or a tokenizer object); "
                "miles_lite.rewards.tiny_clip writes one"
            )
        if len(value_range) != 2:
            raise ConfigError(f"ClipReward value_range must be (low, high), got {value_range!r}")
        low, high = float(value_range[0]), float(value_range[1])
        if not low < high:
            raise ConfigError(
                f"ClipReward value_range must be (low, high) with low < high, got {value_range!r}"
            )
        if len(image_mean) != 3 or len(image_std) != 3 or min(image_std) <= 0:
            raise ConfigError(
                f"ClipReward image_mean/image_std must be 3 values each, std > 0; got {image_mean!r}, {image_std!r}"
            )
        if dtype not in {"float32", "float16", "bfloat16", "float64"}:
            raise ConfigError(
                f"ClipReward dtype must be float32, float16, bfloat16 or float64, got {dtype!r}"
            )
        self.model_path = os.fspath(model_path) if model_path is not None else None
        self.config = config
        self.tokenizer = (
            os.fspath(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer
        )
        self.seed = seed
        self.value_range = (low, high)
        self.image_mean = tuple(float(v) for v in image_mean)
        self.image_std = tuple(float(v) for v in image_std)
        self.device = device
        self.dtype = dtype
        self._model: CLIPModel | None = None
        self._tokenizer: PreTrainedTokenizerBase | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Only the options travel to a worker; the model is rebuilt there on first use.
        state = self.__dict__.copy()
        state["_model"] = None
        state["_tokenizer"] = None
        return state

    def __repr__(self) -> str:
        source = (
            f"model_path={self.model_path!r}"
            if self.model_path
            else f"config=..., seed={self.seed}"
        )
        return f"ClipReward({source}, loaded={self._model is not None})"

    @property
    def loaded(self) -> bool:
        """Whether this instance has its model and tokenizer in memory."""
        return self._model is not None

    def load(self) -> None:
        """Load the tokenizer and model now (the first call does it otherwise); idempotent.

        Blocks for as long as loading takes (seconds for a real checkpoint): call it in a
        worker, never on an event loop. Raises ``RewardError`` if the checkpoint or the
        tokenizer cannot be loaded.
        """
        self._loaded()

    def _loaded(self) -> tuple[CLIPModel, PreTrainedTokenizerBase]:
        if self._model is not None and self._tokenizer is not None:
            return self._model, self._tokenizer
        import torch

        # CLIPTokenizerFast is an alias transformers 5 resolves lazily; mypy cannot see it.
        from transformers import CLIPModel, CLIPTokenizerFast  # type: ignore[attr-defined]

        tokenizer: PreTrainedTokenizerBase
        if isinstance(self.tokenizer, str) or self.tokenizer is None:
            # Each message names the path that failed: the tokenizer's may not be the model's.
            where = str(self.tokenizer or self.model_path)
            _check_local("tokenizer", where)
            try:
                tokenizer = CLIPTokenizerFast.from_pretrained(where)
            except (OSError, ValueError) as exc:
                raise RewardError(
                    f"ClipReward could not load its tokenizer from {where}: {_first_line(exc)}"
                ) from exc
        else:
            tokenizer = self.tokenizer
        if self.config is not None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed)
                # A copy: building a model writes into its config (attention backend).
                model = CLIPModel(copy.deepcopy(self.config))
        else:
            where = str(self.model_path)
            _check_local("model", where)
            try:
                model = CLIPModel.from_pretrained(where)
            except (OSError, ValueError) as exc:
                raise RewardError(
                    f"ClipReward could not load its model from {where}: {_first_line(exc)}"
                ) from exc
        # transformers wraps .to() in a decorator mypy cannot see through.
        model = model.to(device=self.device, dtype=getattr(torch, self.dtype))  # type: ignore[call-arg]
        model.eval()
        model.requires_grad_(False)
        self._model, self._tokenizer = model, tokenizer
        return model, tokenizer

    def __call__(self, samples: list[Sample]) -> list[float]:
        """Score ``samples``: one float per sample, in order (see the class docstring).

        Loads the model on first use. Raises ``RewardError`` naming the sample index when a
        sample has no ``generated_output``, an image of an unsupported shape, or a prompt
        that is not a string; the whole call fails (the pipeline reports it per batch).
        """
        if not samples:
            return []
        import torch

        model, tokenizer = self._loaded()
        vision = cast("CLIPVisionConfig", model.config.vision_config)
        text_config = cast("CLIPTextConfig", model.config.text_config)
        size = vision.image_size
        if not isinstance(size, int):
            raise RewardError(
                f"ClipReward needs a square model image_size, the config has {size!r}"
            )
        prompts = [_prompt_of(s) for s in samples]
        unique = list(dict.fromkeys(prompts))
        frames: list[torch.Tensor] = []
        owners: list[int] = []
        for i, sample in enumerate(samples):
            batch = self._pixels(sample, size)
            frames.append(batch)
            owners.extend([i] * batch.shape[0])

        with torch.inference_mode():
            text = tokenizer(
                unique,
                padding=True,
                truncation=True,
                max_length=text_config.max_position_embeddings,
                return_tensors="pt",
            )
            text_embeds = _features(
                model.get_text_features(
                    input_ids=text["input_ids"].to(self.device),
                    attention_mask=text["attention_mask"].to(self.device),
                )
            )
            pixels = torch.cat(frames).to(device=self.device, dtype=model.dtype)
            image_embeds = _features(model.get_image_features(pixel_values=pixels))
            text_embeds = text_embeds / text_embeds.norm(dim=-1, keepdim=True)
            image_embeds = image_embeds / image_embeds.norm(dim=-1, keepdim=True)
            slot = {p: k for k, p in enumerate(unique)}
            text_index = torch.tensor([slot[prompts[i]] for i in owners], device=self.device)
            cosine = (text_embeds[text_index] * image_embeds).sum(dim=-1).float()
            per_frame = model.logit_scale.exp().float() * cosine
            owner = torch.tensor(owners, device=self.device)
            totals = torch.zeros(len(samples), device=self.device).index_add_(0, owner, per_frame)
            counts = torch.bincount(owner, minlength=len(samples)).float()
            scores = (totals / counts).cpu()
        return [float(v) for v in scores.tolist()]

    def _pixels(self, sample: Sample, size: int) -> torch.Tensor:
        """``sample.generated_output`` as normalized ``[F, 3, S, S]`` float32 pixels."""
        import torch
        import torch.nn.functional as F

        x = sample.generated_output
        where = f"sample {sample.index}"
        if not isinstance(x, torch.Tensor):
            raise RewardError(
                f"ClipReward: {where} has no generated_output tensor (got {type(x).__name__})"
            )
        shape = list(x.shape)
        if x.ndim == 5 and x.shape[0] == 1:
            x = x[0]
        if x.ndim == 3:
            x = x.unsqueeze(1)
        if x.ndim != 4 or min(x.shape) == 0:
            raise RewardError(
                f"ClipReward: {where} generated_output has shape {shape}; "
                "expected [C, H, W], [C, F, H, W] or [1, C, F, H, W]"
            )
        x = x.transpose(0, 1)  # [F, C, H, W]: one image per frame
        channels = x.shape[1]
        if channels != 3:
            x = x[:, [c % channels for c in range(3)]]
        if x.dtype == torch.uint8:
            x = x.float() / 255.0
        else:
            low, high = self.value_range
            x = (x.float() - low) / (high - low)
        x = x.clamp(0.0, 1.0)

        height, width = x.shape[-2:]
        if (height, width) != (size, size):
            scale = size / min(height, width)
            new_h, new_w = max(size, round(height * scale)), max(size, round(width * scale))
            x = F.interpolate(
                x, size=(new_h, new_w), mode="bicubic", antialias=True, align_corners=False
            )
            top, left = (new_h - size) // 2, (new_w - size) // 2
            x = x[..., top : top + size, left : left + size].clamp(0.0, 1.0)
        mean = torch.tensor(self.image_mean).view(1, 3, 1, 1)
        std = torch.tensor(self.image_std).view(1, 3, 1, 1)
        return (x - mean) / std


def _prompt_of(sample: Sample) -> str:
    if not isinstance(sample.prompt, str):
        raise RewardError(
            f"ClipReward: sample {sample.index} has a {type(sample.prompt).__name__} prompt; "
            "it scores a text prompt (a str)"
        )
    return sample.prompt


def _features(output: Any) -> torch.Tensor:
    # transformers < 5 returns the projected embeddings; 5.x a ModelOutput whose
    # pooler_output holds them.
    import torch

    if isinstance(output, torch.Tensor):
        return output
    return output.pooler_output  # type: ignore[no-any-return]


def _check_local(what: str, where: str) -> None:
    """A path that is plainly local (absolute, ``./``, ``~``) and missing fails at once,
    rather than after transformers tries it as a hub id (offline, that is a long wait)."""
    if where.startswith(("/", "./", "../", "~")) and not os.path.exists(os.path.expanduser(where)):
        raise RewardError(f"ClipReward could not load its {what} from {where}: no such folder")


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
