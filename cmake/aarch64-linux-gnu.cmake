# Cross toolchain for arm64 Linux (the Jetson's CPU) with Debian's g++-aarch64-linux-gnu.
# Libraries and headers come from VLAC_AARCH64_SYSROOT, a folder that tools/arm64_sysroot.sh fills
# with Debian's arm64 -dev packages (unpacked, not installed: libdnnl-dev:arm64 cannot be
# installed beside the amd64 one). libc, libstdc++ and libgomp are the cross compiler's own, in
# /usr/aarch64-linux-gnu. Tests run under qemu-user (CMAKE_CROSSCOMPILING_EMULATOR).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

if(NOT VLAC_AARCH64_SYSROOT)
  set(VLAC_AARCH64_SYSROOT "$ENV{VLAC_AARCH64_SYSROOT}")
endif()
if(NOT VLAC_AARCH64_SYSROOT)
  message(FATAL_ERROR "aarch64 toolchain: set VLAC_AARCH64_SYSROOT to the folder "
                      "tools/arm64_sysroot.sh prepared")
endif()
if(NOT EXISTS "${VLAC_AARCH64_SYSROOT}/.vlac-sysroot")
  message(FATAL_ERROR "aarch64 toolchain: ${VLAC_AARCH64_SYSROOT} is not prepared; "
                      "run tools/arm64_sysroot.sh ${VLAC_AARCH64_SYSROOT}")
endif()
# try_compile projects run this file again; they need the same folder.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES VLAC_AARCH64_SYSROOT)

set(_lib "${VLAC_AARCH64_SYSROOT}/usr/lib/aarch64-linux-gnu")
# Packages (GTest, nlohmann_json, CLI11) only from the sysroot, never the host's x86-64 copies;
# programs (qemu, python) from the host.
set(CMAKE_FIND_ROOT_PATH "${VLAC_AARCH64_SYSROOT}" /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# Libraries named bare in target_link_libraries (dnnl, sentencepiece, xxhash) resolve here;
# -isystem keeps the packages' headers out of -Werror warnings like the host's /usr/include.
set(CMAKE_C_FLAGS_INIT "-isystem ${VLAC_AARCH64_SYSROOT}/usr/include")
set(CMAKE_CXX_FLAGS_INIT "-isystem ${VLAC_AARCH64_SYSROOT}/usr/include")
foreach(_kind EXE SHARED MODULE)
  set(CMAKE_${_kind}_LINKER_FLAGS_INIT "-L${_lib} -Wl,-rpath-link,${_lib}")
endforeach()

# Run target programs (tests, gtest discovery) under qemu as a Cortex-A76: NEON and dot product,
# no bf16 and no SVE, the nearest model qemu has to the Jetson Orin's Cortex-A78AE. -L gives the
# cross libc's dynamic loader; -E hands the sysroot's libraries to the guest only.
set(CMAKE_CROSSCOMPILING_EMULATOR
    qemu-aarch64-static -cpu cortex-a76 -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH=${_lib})
