#include "libs/s3/internal/xml_scan.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::s3::internal {
namespace {

using ::testing::ElementsAre;

TEST(XmlScanTest, FindsEachElementWithoutMatchingLongerTagNames) {
  const char* xml =
      "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><KeyCount>2</KeyCount>"
      "<Contents><Key>a</Key><Size>1</Size></Contents>"
      "<Contents><Key>b&amp;c</Key><Size>22</Size></Contents><Empty/></ListBucketResult>";
  EXPECT_THAT(XmlElements(xml, "Contents"),
              ElementsAre("<Key>a</Key><Size>1</Size>", "<Key>b&amp;c</Key><Size>22</Size>"));
  EXPECT_THAT(XmlElements(xml, "Key"), ElementsAre("a", "b&amp;c"));
  EXPECT_THAT(XmlElements(xml, "Empty"), ElementsAre(""));
  EXPECT_EQ(XmlText(xml, "KeyCount"), "2");
  EXPECT_EQ(XmlText(xml, "Missing"), std::nullopt);
  EXPECT_THAT(XmlElements(xml, "ListBucketResult"), ::testing::SizeIs(1));
}

TEST(XmlScanTest, UnescapesNamedAndNumericReferences) {
  EXPECT_EQ(XmlUnescape("&quot;etag&quot; a&amp;b &lt;&gt; &apos;"), "\"etag\" a&b <> '");
  EXPECT_EQ(XmlUnescape("&#65;&#x42;&#xe9;"), "AB\xc3\xa9");
  EXPECT_EQ(XmlUnescape("&bogus; & &#xZZ;"), "&bogus; & &#xZZ;");
}

TEST(XmlScanTest, EscapeRoundTripsThroughUnescape) {
  const std::string text = "\"a\" & <b> 'c'";
  EXPECT_EQ(XmlEscape(text), "&quot;a&quot; &amp; &lt;b&gt; &apos;c&apos;");
  EXPECT_EQ(XmlUnescape(XmlEscape(text)), text);
}

}  // namespace
}  // namespace ckpt::s3::internal
