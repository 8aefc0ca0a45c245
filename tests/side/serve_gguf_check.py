"""Side check, not run by CI: a GGUF export served by llama.cpp's chat API.

Starts llama-cpp-python's OpenAI-compatible server on 127.0.0.1 (a free
port) with a GGUF export, sends one chat request (a user message, the
question) and one plain completion request (the training prompt as text,
as this project builds it), prints both, and stops the server. The server
builds the chat prompt from the GGUF's own tokenizer.chat_template, so the
check passes (exit 0) when the chat request's prompt has exactly as many
tokens as the training prompt (BOS included, counted by the server and by
this project's tokenizer) and both requests, greedy, give the same answer.

llama-cpp-python is not a dependency of this project: install it in a
venv of its own, e.g.

  python -m venv /work/llama_venv
  /work/llama_venv/bin/pip install 'llama-cpp-python[server]'
  python -m agent_tunix.export --config=configs/gemma3_270m.py --allow_base \
      --format=gguf --gguf_dtype=q8_0 --output=/tmp/serve/gemma3_270m.gguf
  python tests/side/serve_gguf_check.py --gguf=/tmp/serve/gemma3_270m.gguf \
      --server_python=/work/llama_venv/bin/python --config=configs/gemma3_270m.py

--config names the preset the GGUF was exported with (it sets the
training prompt and its stop texts compared against).
"""
import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
sys.path.insert(0, _REPO)
# pylint: disable=g-import-not-at-top,wrong-import-position
from agent_tunix.data import prompts
from agent_tunix.models import families
from agent_tunix.models import tokenizer as tokenizer_lib
from agent_tunix.rl import rollout

QUESTION = ('Mia has 125 cards. She buys 4 packs of 25 cards, then gives 38 '
            'away. How many cards are left?')


def free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def post(url, body, timeout):
  request = urllib.request.Request(
      url, json.dumps(body).encode(), {'Content-Type': 'application/json'})
  with urllib.request.urlopen(request, timeout=timeout) as reply:
    return json.load(reply)


def wait_until_up(base, server, deadline):
  while time.monotonic() < deadline:
    if server.poll() is not None:
      raise SystemExit(f'server exited with {server.returncode}')
    try:
      with urllib.request.urlopen(base + '/models', timeout=5) as reply:
        return json.load(reply)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
      time.sleep(1)
  raise SystemExit('server did not answer in time')


def load_config(path):
  spec = importlib.util.spec_from_file_location('preset', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--gguf', required=True)
  parser.add_argument('--server_python', default='/work/llama_venv/bin/python')
  parser.add_argument('--config', default='configs/gemma3_270m.py')
  parser.add_argument('--max_tokens', type=int, default=64)
  parser.add_argument('--timeout', type=float, default=300,
                      help='seconds for the start and each request')
  args = parser.parse_args()
  config = load_config(args.config)
  prompt = prompts.format_prompt(
      QUESTION, config, families.of_preset(config.model.preset).tool_format)
  stop = list(rollout.stop_sequences_from_config(config)) or None
  port = free_port()
  command = [args.server_python, '-m', 'llama_cpp.server',
             '--model', args.gguf, '--host', '127.0.0.1', '--port', str(port),
             '--n_ctx', '2048', '--model_alias', 'policy']
  print('$', ' '.join(command), flush=True)
  # The server's log goes to a file: its load log alone can fill a pipe.
  log_file = tempfile.TemporaryFile('w+')
  server = subprocess.Popen(command, stdout=log_file,
                            stderr=subprocess.STDOUT, text=True)
  base = f'http://127.0.0.1:{port}/v1'
  try:
    wait_until_up(base, server, time.monotonic() + args.timeout)
    chat_body = {'model': 'policy', 'temperature': 0,
                 'max_tokens': args.max_tokens, 'stop': stop,
                 'messages': [{'role': 'user', 'content': QUESTION}]}
    print('POST /v1/chat/completions', json.dumps(chat_body), flush=True)
    chat = post(base + '/chat/completions', chat_body, args.timeout)
    print(json.dumps(chat, indent=1), flush=True)
    text_body = {'model': 'policy', 'temperature': 0, 'prompt': prompt,
                 'max_tokens': args.max_tokens, 'stop': stop}
    text = post(base + '/completions', text_body, args.timeout)
    print('POST /v1/completions (the training prompt as text):',
          json.dumps(text, indent=1), flush=True)
  finally:
    server.terminate()
    try:
      server.wait(timeout=30)
    except subprocess.TimeoutExpired:
      server.kill()
      server.wait()
    log_file.seek(0)
    for line in log_file.read().splitlines():
      if line.startswith(('Using gguf chat template', 'Using chat',
                          'INFO:')):
        print('server:', line[:160])
    log_file.close()
  answer = chat['choices'][0]['message']['content']
  same_text = answer == text['choices'][0]['text']
  # The trainer's own count: BOS and the prompt, with this project's
  # tokenizer of the GGUF.
  tokenizer = tokenizer_lib.load_gguf_tokenizer(args.gguf)
  trained = 1 + len(tokenizer.encode(prompt))
  same_prompt = (chat['usage']['prompt_tokens'] == trained
                 == text['usage']['prompt_tokens'])
  print(f'prompt tokens: chat request {chat["usage"]["prompt_tokens"]}, '
        f'training prompt as text {text["usage"]["prompt_tokens"]}, the '
        f'trainer\'s {trained}; same answer: {same_text}')
  return 0 if same_text and same_prompt else 1


if __name__ == '__main__':
  sys.exit(main())
