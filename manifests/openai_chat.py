"""Ask a tb InferenceService with the OpenAI Python SDK: one chat completion, one streamed.

    python openai_chat.py BASE_URL MODEL ["question"]

BASE_URL is the service's endpoint (`tbctl get isvc NAME` shows it, e.g.
http://10.0.0.1:32324/v1). Prints one JSON object with both answers and their token usage.
"""

import json
import sys

from openai import OpenAI


def main() -> None:
    base_url, model = sys.argv[1], sys.argv[2]
    question = sys.argv[3] if len(sys.argv) > 3 else "Name three colours of the rainbow."
    client = OpenAI(base_url=base_url, api_key="unused", timeout=120, max_retries=0)
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": question},
    ]
    answer = client.chat.completions.create(
        model=model, messages=messages, max_tokens=32, temperature=0
    )
    pieces, usage, finish = [], None, None
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=32,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    models = [m.id for m in client.models.list()]
    retrieved = client.models.retrieve(model).id
    print(
        json.dumps(
            {
                "text": answer.choices[0].message.content,
                "finish_reason": answer.choices[0].finish_reason,
                "usage": answer.usage.model_dump(),
                "stream_text": "".join(pieces),
                "stream_finish_reason": finish,
                "stream_usage": usage,
                "models": models,
                "retrieved": retrieved,
            }
        )
    )


if __name__ == "__main__":
    main()
