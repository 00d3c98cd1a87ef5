"""``python -m rocket_rides``: the same as ``idempotence demo``."""

from .cli import demo

if __name__ == "__main__":
    demo(prog_name="python -m rocket_rides")
