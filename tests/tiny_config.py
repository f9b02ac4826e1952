"""A tiny distillation config for subprocess tests: teacher and corpus come from environment variables."""

import os

from conftest import tiny_config


def get_config():
  return tiny_config(os.environ["TINY_TEACHER"], os.environ["TINY_CORPUS"])
