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
# cpp-httplib (tandem serve): the image has none; carry Debian's libcpp-httplib-dev and libcpp-httplib0.11
# (`apt-get download libcpp-httplib-dev libcpp-httplib0.11`). Its runtime needs libssl3, libbrotli1 and zlib,
# which Ubuntu 24.04 has; its header needs the OpenSSL headers (without them: the serve stub). TANDEM_EXTRA_CMAKE tells run_all.sh's configure where it is.
hdev=$(ls .debs/libcpp-httplib-dev_*.deb 2>/dev/null | head -1)
hlib=$(ls .debs/libcpp-httplib0*.deb 2>/dev/null | head -1)
if [ -n "$hdev" ] && [ -n "$hlib" ] && [ ! -f /usr/include/httplib.h ] && [ -f /usr/include/openssl/ssl.h ]; then
  mkdir -p /tmp/httplib && dpkg -x "$hdev" /tmp/httplib && dpkg -x "$hlib" /tmp/httplib
  hl=/tmp/httplib/usr/lib/x86_64-linux-gnu
  so=$(ls "$hl"/libcpp-httplib.so.* | head -1)
  ln -sf "$so" "$hl/libcpp-httplib.so"
  sed -i "s|^prefix=.*|prefix=/tmp/httplib/usr|" "$hl/pkgconfig/cpp-httplib.pc" 2>/dev/null
  export PKG_CONFIG_PATH=$hl/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export LD_LIBRARY_PATH=$hl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export TANDEM_EXTRA_CMAKE="-DTANDEM_HTTPLIB_INCLUDE=/tmp/httplib/usr/include -DTANDEM_HTTPLIB_LIB=$hl/libcpp-httplib.so"
fi
