# Writes OUT, a C++ file defining
#   extern "C" const unsigned char NAME[];
#   extern "C" const unsigned long long NAME_size;
# from the bytes of IN (empty, size 0, when IN is not given). Run as
# `cmake -DIN=... -DOUT=... -DNAME=... -P TpuhalEmbed.cmake`.
if(IN)
  file(READ "${IN}" _hex HEX)
  string(LENGTH "${_hex}" _len)
  math(EXPR _bytes "${_len} / 2")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," _body "${_hex}")
  string(REGEX REPLACE "((0x..,){32})" "\\1\n" _body "${_body}")
else()
  set(_bytes 0)
  set(_body "0")
endif()
file(WRITE "${OUT}.tmp" "// Generated from ${IN} by cmake/TpuhalEmbed.cmake: do not edit.\n"
  "extern \"C\" alignas(64) const unsigned char ${NAME}[] = {\n${_body}\n};\n"
  "extern \"C\" const unsigned long long ${NAME}_size = ${_bytes};\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
