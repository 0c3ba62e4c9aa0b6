"""Ask a tb InferenceService with the OpenAI Python SDK: one chat completion, one streamed.

    python openai_chat.py BASE_URL MODEL ["question"]

BASE_URL is the service's URL (`tbctl get isvc NAME` shows it, e.g.
https://10.0.0.9:7401/services/default/chat/v1, which stays put when tb moves the service). The
API key is a tb user token, from OPENAI_API_KEY; TB_CA_CERT names the cluster CA that the URL's
certificate is signed by.
Prints one JSON object with both answers and their token usage.
"""

import json
import os
import ssl
import sys

from openai import DefaultHttpxClient, OpenAI


def main() -> None:
    base_url, model = sys.argv[1], sys.argv[2]
    question = sys.argv[3] if len(sys.argv) > 3 else "Name three colours of the rainbow."
    ca = os.environ.get("TB_CA_CERT")
    http_client = DefaultHttpxClient(verify=ssl.create_default_context(cafile=ca)) if ca else None
    client = OpenAI(
        base_url=base_url,
        api_key=os.environ.get("OPENAI_API_KEY", "unused"),
        timeout=120,
        max_retries=0,
        http_client=http_client,
    )
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
