#!/bin/sh
echo "bazel coverage is not available: its tools cannot be downloaded in this offline build." >&2
exit 1
