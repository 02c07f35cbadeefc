# cmake -DROOT=<source> -DWORK=<dir> -P board_ids_test.cmake
# Runs cmake/TpuhalBoards.cmake's generator on profiles written here and
# checks its output: a profile's "pci" and "usb" members become the lines the
# providers compile in, a profile without them adds none.
set(TPUHAL_PROFILE_DIR ${WORK}/profiles)
include(${ROOT}/cmake/TpuhalBoards.cmake)
file(REMOVE_RECURSE ${WORK})
file(WRITE ${WORK}/profiles/a.json [=[{ "name": "a", "pci": { "vendor": "0x1f1c", "device": "0x00aa" } }]=])
file(WRITE ${WORK}/profiles/b.json [=[{ "name": "b", "usb": { "vendor": "0x1209", "product": "0x0010", "loader_product": "0x0011" } }]=])
file(WRITE ${WORK}/profiles/c.json [=[{ "name": "c", "usb": { "vendor": "0x1209", "product": "0x0020" } }]=])
file(WRITE ${WORK}/profiles/d.json [=[{ "name": "d" }]=])
tpuhal_board_ids(OUTPUT ${WORK}/pci.inc BUS pci)
tpuhal_board_ids(OUTPUT ${WORK}/usb.inc BUS usb)
file(STRINGS ${WORK}/pci.inc pci REGEX "^{")
file(STRINGS ${WORK}/usb.inc usb REGEX "^{")
set(want_pci [[{{0x1f1c, 0x00aa}, "a"},]])
set(want_usb [[{0x1209, 0x0010, 0x0011, "b"},;{0x1209, 0x0020, 0, "c"},]])
if(NOT pci STREQUAL want_pci)
  message(FATAL_ERROR "pci lines: got '${pci}', want '${want_pci}'")
endif()
if(NOT usb STREQUAL want_usb)
  message(FATAL_ERROR "usb lines: got '${usb}', want '${want_usb}'")
endif()
message(STATUS "board ids: ok")
