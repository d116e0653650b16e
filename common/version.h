// The version every Pacer binary prints for --version (docs/configuration.md).
//
// One string for the whole build: CMake's project version, then `git describe --always
// --dirty` of the source tree taken when CMake configured the build (absent outside a git
// checkout, e.g. a source tarball). Generated into the build tree from common/version.cc.in.
#pragma once

namespace pacer {

// "0.1.0" or "0.1.0 (git 6a35ac3-dirty)".
const char* PacerVersion();

}  // namespace pacer
