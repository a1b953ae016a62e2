#!/usr/bin/env bash
# Source this on the GPU machine before a build there: it unpacks a carried libpcre2-dev .deb (the image has
# the PCRE2 runtime but not its headers; fetch the .deb on the dev machine with
# `mkdir -p .debs && cd .debs && apt-get download libpcre2-dev` and carry .debs) into /tmp/pcre and points
# pkg-config at it.
deb=$(ls .debs/libpcre2-dev*.deb 2>/dev/null | head -1)
if [ -n "$deb" ] && ! pkg-config --exists libpcre2-8 2>/dev/null; then
  mkdir -p /tmp/pcre && dpkg -x "$deb" /tmp/pcre
  lib=/tmp/pcre/usr/lib/x86_64-linux-gnu
  ln -sf /usr/lib/x86_64-linux-gnu/libpcre2-8.so.0 "$lib/libpcre2-8.so"
  sed -i "s|^prefix=.*|prefix=/tmp/pcre/usr|" "$lib/pkgconfig/libpcre2-8.pc"
  export PKG_CONFIG_PATH=$lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  pkg-config --cflags --libs libpcre2-8
fi
