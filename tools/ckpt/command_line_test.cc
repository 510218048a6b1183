#include "tools/ckpt/command_line.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt::cli {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

const std::vector<OptionSpec> kGlobals = {
    {"store_dir", "DIR", "embedded store directory", "./ckpt-data"},
    {"verbose", "", "more output", ""},
};

const std::vector<CommandSpec> kCommands = {
    {"convert",
     "IN OUT",
     "convert a checkpoint",
     2,
     2,
     {{"format", "torch|safetensors", "output format", "torch"},
      {"strip-prefix", "auto|none|PREFIX", "wrapper prefix to strip", "auto"},
      {"dry-run", "", "change nothing", ""}}},
    {"ls", "[MODEL]", "list models", 0, 1, {}},
};

absl::StatusOr<ParsedCommandLine> Parse(std::vector<std::string> args) {
  return ParseCommandLine(kCommands, kGlobals, args);
}

TEST(ParseCommandLineTest, ParsesCommandArgumentsAndBothOptionForms) {
  ASSERT_OK_AND_ASSIGN(ParsedCommandLine parsed,
                       Parse({"--store_dir=/data", "convert", "in.pt", "--strip-prefix", "module.",
                              "out.safetensors", "--format=safetensors", "--dry-run"}));
  EXPECT_EQ(parsed.command(), "convert");
  EXPECT_THAT(parsed.arguments(), ElementsAre("in.pt", "out.safetensors"));
  EXPECT_EQ(parsed.Get("strip-prefix"), "module.");
  EXPECT_EQ(parsed.Get("format"), "safetensors");
  EXPECT_EQ(parsed.Get("store_dir"), "/data");
  EXPECT_TRUE(parsed.Has("dry-run"));
  EXPECT_FALSE(parsed.Has("verbose"));
}

TEST(ParseCommandLineTest, FallsBackToDefaults) {
  ASSERT_OK_AND_ASSIGN(ParsedCommandLine parsed, Parse({"convert", "a", "b"}));
  EXPECT_EQ(parsed.Get("format"), "torch");
  EXPECT_EQ(parsed.Get("store_dir"), "./ckpt-data");
  EXPECT_FALSE(parsed.Has("format"));
}

TEST(ParseCommandLineTest, DoubleDashEndsOptions) {
  ASSERT_OK_AND_ASSIGN(ParsedCommandLine parsed, Parse({"convert", "--", "--weird", "b"}));
  EXPECT_THAT(parsed.arguments(), ElementsAre("--weird", "b"));
}

TEST(ParseCommandLineTest, ExplainsMistakes) {
  EXPECT_THAT(Parse({"convrt"}), StatusIs(absl::StatusCode::kInvalidArgument,
                                          "unknown command 'convrt'; commands: convert, ls"));
  EXPECT_THAT(
      Parse({"convert", "a", "b", "--colour"}),
      StatusIs(absl::StatusCode::kInvalidArgument, "unknown option --colour for 'convert'"));
  EXPECT_THAT(Parse({"convert", "a", "b", "--format"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "--format needs a value"));
  EXPECT_THAT(Parse({"convert", "a"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "takes IN OUT, got 1 argument(s)"));
  EXPECT_THAT(Parse({"ls", "--dry-run"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown option --dry-run"));
  EXPECT_THAT(Parse({"convert", "a", "b", "--dry-run=yes"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "is a switch"));
}

TEST(ParseCommandLineTest, HelpSkipsArgumentChecks) {
  ASSERT_OK_AND_ASSIGN(ParsedCommandLine parsed, Parse({"convert", "--help"}));
  EXPECT_TRUE(parsed.help_requested());
  ASSERT_OK_AND_ASSIGN(ParsedCommandLine top, Parse({"-h"}));
  EXPECT_TRUE(top.help_requested());
  EXPECT_EQ(top.command(), "");
}

TEST(HelpTest, ListsCommandsOptionsAndDefaults) {
  const std::string program = ProgramHelp("ckpt", "Checkpoint tool.", kCommands, kGlobals);
  EXPECT_THAT(program, HasSubstr("convert IN OUT"));
  EXPECT_THAT(program, HasSubstr("--store_dir DIR"));
  EXPECT_THAT(program, HasSubstr("(default: ./ckpt-data)"));
  const std::string command = CommandHelp("ckpt", kCommands[0], kGlobals);
  EXPECT_THAT(command, HasSubstr("Usage: ckpt convert IN OUT [OPTIONS]"));
  EXPECT_THAT(command, HasSubstr("--strip-prefix auto|none|PREFIX"));
}

TEST(HelpTest, DetailsFollowTheSummaryInTheCommandsHelpOnly) {
  const std::vector<CommandSpec> commands = {
      {"gc", "", "Free garbage.", 0, 0, {}, "Abandoned uploads wait out a grace first.\n"}};
  EXPECT_THAT(CommandHelp("ckpt", commands[0], {}),
              HasSubstr("Free garbage.\n\nAbandoned uploads wait out a grace first.\n"));
  EXPECT_THAT(ProgramHelp("ckpt", "Checkpoint tool.", commands, {}),
              Not(HasSubstr("Abandoned uploads")));
}

TEST(GetIntTest, ParsesOrExplains) {
  const std::vector<CommandSpec> commands = {
      {"retain", "MODEL", "", 1, 1, {{"keep-last", "N", "", "0"}}}};
  ASSERT_OK_AND_ASSIGN(ParsedCommandLine parsed,
                       ParseCommandLine(commands, {}, {"retain", "m", "--keep-last", "5"}));
  EXPECT_EQ(parsed.GetInt("keep-last").value(), 5);
  ASSERT_OK_AND_ASSIGN(ParsedCommandLine bad,
                       ParseCommandLine(commands, {}, {"retain", "m", "--keep-last", "five"}));
  EXPECT_THAT(bad.GetInt("keep-last"),
              StatusIs(absl::StatusCode::kInvalidArgument, "--keep-last expects an integer"));
}

TEST(GetAllTest, RepeatableOptionsKeepEveryValueInOrder) {
  const std::vector<CommandSpec> commands = {
      {"promote", "REF ALIAS", "", 2, 2, {{"require", "COND", "a rule", "", true}}}};
  ASSERT_OK_AND_ASSIGN(
      ParsedCommandLine parsed,
      ParseCommandLine(commands, {},
                       {"promote", "--require", "a>=1", "m@1", "prod", "--require=b<=2"}));
  EXPECT_THAT(parsed.GetAll("require"), ElementsAre("a>=1", "b<=2"));
  EXPECT_EQ(parsed.Get("require"), "b<=2");
  EXPECT_THAT(parsed.GetAll("missing"), IsEmpty());
  EXPECT_THAT(CommandHelp("ckpt", commands[0], {}), HasSubstr("a rule (repeatable)"));
}

}  // namespace
}  // namespace ckpt::cli
