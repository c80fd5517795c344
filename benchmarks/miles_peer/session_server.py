"""miles 0.0.2's standalone session server, run in the peer venv (no Ray, no GPU).

    $VENV/bin/python benchmarks/miles_peer/session_server.py \
        --tokenizer DIR --port PORT --backend-url http://127.0.0.1:ENGINE_PORT

The same ``SessionServer`` miles' ``run_session_server`` builds. That entry point runs
uvicorn at log level "info" and miles' middleware logs two INFO lines per request; here
both are at WARNING, so the peer pays for no logging (its fastest setting).
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import uvicorn
from miles.rollout.session.session_server import SessionServer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True, help="a folder with the HF tokenizer")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend-url", required=True)
    a = parser.parse_args()
    args = SimpleNamespace(
        hf_checkpoint=a.tokenizer,
        chat_template_path=None,
        tito_model="default",
        apply_chat_template_kwargs=None,
        tito_allowed_append_roles=None,
        session_server_instance_id="peer-0",
        session_server_ip="127.0.0.1",
        session_server_port=a.port,
        miles_router_timeout=600.0,
        use_rollout_routing_replay=False,
    )
    server = SessionServer(args, a.backend_url)
    uvicorn.run(server.app, host="127.0.0.1", port=a.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
