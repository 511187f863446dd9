// Decoding JPEG and PNG files into Images with the maintained libraries (libjpeg-turbo, libpng),
// with the settings Pillow opens them with, so that the pixels are Pillow's:
//   JPEG: libjpeg's defaults (islow DCT, fancy upsampling); gray files are "L", colour "RGB"
//         (CMYK and other colour spaces refused).
//   PNG:  8-bit gray "L", gray + alpha "LA", "RGB", "RGBA"; palettes "P" (expanded to their RGB
//         colours; a tRNS chunk is ignored, as Pillow's convert("RGB") ignores it); gray of 1, 2 or
//         4 bits scaled to 8 ("L"); 16-bit colour keeps each sample's high byte (Pillow's
//         "RGB;16B" unpacking). 16-bit gray is refused: Pillow opens it as "I;16", whose
//         conversion to RGB clips at 255 rather than scaling.
// Errors (unreadable, truncated or corrupt files, unsupported kinds) name the file and the
// reason.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "image/image.h"

namespace megatron::image {

// `bytes` of an image file; `name` names it in errors. The format comes from the first bytes.
Image decode(const std::vector<uint8_t>& bytes, const std::string& name);
// The same for a file on disk.
Image read_file(const std::string& path);
// A whole image file's bytes; a missing or unreadable file is an error naming it.
std::vector<uint8_t> read_bytes(const std::string& path);

}  // namespace megatron::image
