"""The deterministic fake model and its tokenizer.

Everything here is a pure function of its inputs, so a verification can hold a reference
answer (REFERENCE_ANSWERS) and every process computes the same text for the same prompt:
prefill and decode agree without exchanging the answer.

Tokenizer (an approximation of a BPE tokenizer's counts, documented so tests can predict
them): every run of letters/digits is one token per started 4 characters, every other
non-space character is one token. Token ids are crc32 of the piece modulo VOCAB_SIZE
(ids below 3 are reserved: 0 pad, 1 BOS, 2 EOS).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import zlib
from typing import Any
from collections.abc import Iterable

VOCAB_SIZE = 32000
EOS_TOKEN_ID = 2

# The probe answers a verification may rely on (question, normalised -> answer words).
REFERENCE_ANSWERS: dict[str, str] = {
    "what is the capital of france? answer in one word.": "Paris",
    "what is the capital of germany? answer in one word.": "Berlin",
    "what is the capital of japan? answer in one word.": "Tokyo",
    "what is 2 + 2? answer with a single number.": "4",
    "what is 2+2? answer with a single number.": "4",
    "reply with the single word ok.": "OK",
}
# With the wrong_output fault the same probes get these.
WRONG_ANSWERS: dict[str, str] = {
    "Paris": "Lyon",
    "Berlin": "Munich",
    "Tokyo": "Osaka",
    "4": "5",
    "OK": "NO",
}

_WORDS = (
    "the of and to in is was for on that with as by at from his her an which are be this "
    "it not or have had were their one all we can but been has more there when who will "
    "would so if no out up into about than them only other time new some could these two "
    "may first then do any like my now over such our man me even most made after also did "
    "many off before must well back through years where much your way down should because "
    "each just those people how too little state good very make world still own see men "
    "work long here get both between life being under never day same another know while "
    "last might us great old year since against go came right used take three small large "
    "river mountain city light water stone garden music paper window bridge forest signal "
    "engine market harbor silver yellow orange purple quiet rapid gentle bright distant"
).split()

_PIECE = re.compile(r"\w+|[^\w\s]")


def _pieces(text: str) -> list[str]:
    out: list[str] = []
    for piece in _PIECE.findall(text):
        if piece[0].isalnum() or piece[0] == "_":
            out.extend(piece[i : i + 4] for i in range(0, len(piece), 4))
        else:
            out.append(piece)
    return out


def _token_id(piece: str) -> int:
    return 3 + zlib.crc32(piece.encode("utf-8")) % (VOCAB_SIZE - 3)


def tokenize(text: str) -> list[int]:
    return [_token_id(p) for p in _pieces(text)]


def count_tokens(text: str) -> int:
    return len(_pieces(text))


def message_text(content: Any) -> str:
    """OpenAI message content: a string or a list of parts (text parts are kept)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return str(content)


def apply_chat_template(messages: Iterable[dict[str, Any]]) -> str:
    """A fixed chat template: <|role|>\\ncontent\\n per message, then <|assistant|>\\n."""
    text = []
    for msg in messages:
        text.append(f"<|{msg.get('role', 'user')}|>\n{message_text(msg.get('content'))}\n")
    text.append("<|assistant|>\n")
    return "".join(text)


def last_user_text(messages: list[dict[str, Any]]) -> str:
    for msg in reversed(messages):
        if msg.get("role") == "user":
            return message_text(msg.get("content"))
    return message_text(messages[-1].get("content")) if messages else ""


def normalise(question: str) -> str:
    return " ".join(question.strip().lower().split())


@dataclasses.dataclass(frozen=True)
class Completion:
    """What the model generates for one request."""

    words: list[str]  # one output token per word
    token_ids: list[int]
    finish_reason: dict[str, Any]  # SGLang's meta_info.finish_reason

    @property
    def pieces(self) -> list[str]:
        """The text each token adds (the streamed deltas)."""
        return [w if i == 0 else " " + w for i, w in enumerate(self.words)]

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def openai_finish_reason(self) -> str:
        return self.finish_reason["type"]


def _natural_answer(question: str, wrong: bool) -> list[str]:
    key = normalise(question)
    answer = REFERENCE_ANSWERS.get(key)
    if answer is None:
        for probe, value in REFERENCE_ANSWERS.items():
            if key.endswith(probe):
                answer = value
                break
    if answer is not None:
        if wrong:
            answer = WRONG_ANSWERS.get(answer, answer + "?")
        return answer.split()
    seed = hashlib.sha256((("wrong:" if wrong else "") + key).encode("utf-8")).digest()
    length = 16 + seed[0] % 49
    words = []
    for i in range(length):
        h = hashlib.blake2b(seed + i.to_bytes(4, "little"), digest_size=4).digest()
        words.append(_WORDS[int.from_bytes(h, "little") % len(_WORDS)])
    words[0] = words[0].capitalize()
    return words


def _filler(question: str, start: int, count: int) -> list[str]:
    seed = hashlib.sha256(("filler:" + normalise(question)).encode("utf-8")).digest()
    out = []
    for i in range(start, start + count):
        h = hashlib.blake2b(seed + i.to_bytes(4, "little"), digest_size=4).digest()
        out.append(_WORDS[int.from_bytes(h, "little") % len(_WORDS)])
    return out


def generate(
    question: str,
    max_new_tokens: int | None,
    *,
    wrong: bool = False,
    ignore_eos: bool = False,
    limit: int = 4096,
) -> Completion:
    """The completion of `question` (the last user message, or the raw prompt).

    max_new_tokens None means "until EOS" (bounded by `limit`, the room left in the
    context); 0 gives an empty completion with finish_reason length, like SGLang.
    """
    cap = limit if max_new_tokens is None else min(max_new_tokens, limit)
    cap = max(cap, 0)
    words = _natural_answer(question, wrong)
    if ignore_eos:
        if len(words) < cap:
            words = words + _filler(question, len(words), cap - len(words))
        words = words[:cap]
        finish: dict[str, Any] = {"type": "length", "length": cap}
    elif len(words) < cap or (max_new_tokens is None and len(words) <= cap):
        # EOS fits: the model stops by itself.
        finish = {"type": "stop", "matched": EOS_TOKEN_ID}
    else:
        words = words[:cap]
        finish = {"type": "length", "length": cap}
    ids = [_token_id(w) for w in words]
    return Completion(words=words, token_ids=ids, finish_reason=finish)
