#!/usr/bin/env bash
# Debian/Ubuntu packages the tests need: a virtual X server (Xvfb) and the libraries Qt and
# napari's OpenGL canvas load (GUI tests), and HAProxy (the balancer in front of several servers,
# deploy/haproxy/). The plugin itself needs none of them on a desktop.
set -euo pipefail
PACKAGES="xvfb xauth libgl1-mesa-dri libegl1 libxkbcommon-x11-0 libxcb-cursor0 libxcb-icccm4
libxcb-keysyms1 libxcb-shape0 libxcb-xinerama0 libxcb-randr0 libxcb-render-util0 libxcb-image0 haproxy"
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $PACKAGES > /dev/null
