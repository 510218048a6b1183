#ifndef CKPT_LIBS_S3_INTERNAL_XML_SCAN_H_
#define CKPT_LIBS_S3_INTERNAL_XML_SCAN_H_

// The little XML the S3 client reads and writes: S3's responses (ListBucketResult, Error,
// InitiateMultipartUploadResult) are flat, attribute-free elements with escaped text, so a scan
// for <Tag>...</Tag> is enough and spares the build an XML library. Not a general XML parser: no
// CDATA, comments or namespaces prefixes on the elements looked up. Private to libs/s3.

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace ckpt::s3::internal {

// The raw inner text of each <tag>...</tag> (or <tag attr="...">...</tag>) in `xml`, in order,
// not descending into a match. <tag/> yields an empty element.
std::vector<absl::string_view> XmlElements(absl::string_view xml, absl::string_view tag);

// The unescaped text of the first <tag> element; nullopt when there is none.
std::optional<std::string> XmlText(absl::string_view xml, absl::string_view tag);

// Decodes &amp; &lt; &gt; &quot; &apos; and numeric references (&#NN; &#xNN;, as UTF-8); an
// unknown or malformed reference is kept as written.
std::string XmlUnescape(absl::string_view text);

// Escapes & < > " ' for element text.
std::string XmlEscape(absl::string_view text);

}  // namespace ckpt::s3::internal

#endif  // CKPT_LIBS_S3_INTERNAL_XML_SCAN_H_
