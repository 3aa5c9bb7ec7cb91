#!/usr/bin/env bash
# What .ci/gpu_official.py needs beside the clone, made on a machine with a network (neither part is committed: the
# official code is not ours, and the wheels are another project's): the official CoLA repository as .official/CoLA
# (from the git directory of a clone of github.com/alvin-zyl/CoLA), and the wheels its code needs for the GPU
# machine's Python 3.12 in .whl/. Copy both along with the clone to the GPU machine, then `bash .ci/gpu_check`.
#   git clone https://github.com/alvin-zyl/CoLA /tmp/CoLA && bash .ci/gpu_carry.sh /tmp/CoLA/.git
set -euo pipefail
cd "$(dirname "$0")/.."
snapshot=${1:?give the git directory of the official CoLA repository}
grep -qx '/.official/' .git/info/exclude || echo /.official/ >> .git/info/exclude
grep -qx '/.whl/' .git/info/exclude || echo /.whl/ >> .git/info/exclude
rm -rf .official/CoLA && mkdir -p .official/CoLA
git -C "$snapshot" archive HEAD | tar -x -C .official/CoLA
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl transformers==4.48.3 tokenizers==0.21.4 huggingface_hub==0.36.2 safetensors regex
ls .official/CoLA/cola .whl
