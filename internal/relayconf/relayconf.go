// Package relayconf owns `relay run`'s configuration file: a YAML
// document whose top-level keys are the flags of `relay run` (by their
// names, without the dashes in front) and three sections: topic-defaults
// and topics, that declare the embedded broker's topics by their Kafka
// config names, and share-groups, that declare share groups' configs
// (checked by the Kafka listener's own rules, protocol.
// ValidateShareGroupConfig; the listener applies them, see internal/cli).
// It parses the file, naming the line of every mistake, and applies the
// declared topics to a broker, all or nothing.
//
// The file is parsed with go.yaml.in/yaml/v3 (the YAML organisation's
// maintained continuation of gopkg.in/yaml.v3, already a dependency),
// through its node tree, so that every key and value keeps its line and a
// flag's value reaches the FlagSet as written.
package relayconf

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/broker/protocol"
	"github.com/outboxrelay/relay/relay"
)

// File is a parsed configuration file.
type File struct {
	Path string
	// Flags are the flag settings, in the file's order.
	Flags []Setting
	// Defaults fills the unset configs of topics created from now on,
	// declared or not (topic-defaults).
	Defaults broker.TopicConfig
	// Topics are the declared topics, in the file's order.
	Topics []Topic
	// ShareGroups are the declared share groups, in the file's order.
	ShareGroups []ShareGroup
}

// ShareGroup is one declared share group: the configs the file sets, by
// Kafka's names, in the file's order. The others keep their value.
type ShareGroup struct {
	Name    string
	Line    int
	Configs []protocol.ShareGroupConfig
}

// Setting is one flag's value from the file.
type Setting struct {
	Name, Value string
	Line        int
}

// Topic is one declared topic.
type Topic struct {
	Name string
	Line int
	// Config holds the configs the file sets; the others are zero and
	// take the defaults. Its partition count is zero when not declared:
	// an existing topic then keeps its count.
	Config broker.TopicConfig
	// PartitionsLine is the line of its partitions key (0: none).
	PartitionsLine int
	// AllowRepartition confirms a partition increase of this topic.
	AllowRepartition bool
	// CloudEvents is the topic's CloudEvents mode (off, binary or
	// structured), overriding --cloudevents; empty when not declared.
	CloudEvents string
}

// Section names of the file; every other top-level key is a flag.
const (
	SectionTopics      = "topics"
	SectionDefaults    = "topic-defaults"
	SectionShareGroups = "share-groups"
)

// Error is a mistake in the file, at a line.
type Error struct {
	Path string
	Line int
	Msg  string
}

func (e *Error) Error() string {
	if e.Line == 0 {
		return fmt.Sprintf("%s: %s", e.Path, e.Msg)
	}
	return fmt.Sprintf("%s:%d: %s", e.Path, e.Line, e.Msg)
}

// Read reads and parses the file at path.
func Read(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	return Parse(path, data)
}

// Parse parses a configuration file's contents; path names it in errors.
func Parse(path string, data []byte) (*File, error) {
	f := &File{Path: path}
	fail := func(line int, format string, args ...any) error {
		return &Error{Path: path, Line: line, Msg: fmt.Sprintf(format, args...)}
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return f, nil
		}
		return nil, &Error{Path: path, Msg: strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, fail(extra.Line, "a second YAML document: the file holds one")
	}
	if len(doc.Content) == 0 {
		return f, nil
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fail(root.Line, "the file must be a mapping of settings (key: value)")
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if first, dup := seen[k.Value]; dup {
			return nil, fail(k.Line, "%s is set twice (first on line %d)", k.Value, first)
		}
		seen[k.Value] = k.Line
		switch k.Value {
		case SectionTopics:
			if err := f.parseTopics(v, fail); err != nil {
				return nil, err
			}
		case SectionShareGroups:
			if err := f.parseShareGroups(v, fail); err != nil {
				return nil, err
			}
		case SectionDefaults:
			cfg, _, _, err := parseTopicConfig(v, fail, false)
			if err != nil {
				return nil, err
			}
			if err := broker.CheckTopicConfig(cfg, broker.TopicConfig{}); err != nil {
				return nil, fail(v.Line, "%s: %v", SectionDefaults, err)
			}
			f.Defaults = cfg
		default:
			value, err := scalar(v)
			if err != nil {
				return nil, fail(v.Line, "%s: %v", k.Value, err)
			}
			f.Flags = append(f.Flags, Setting{Name: k.Value, Value: value, Line: v.Line})
		}
	}
	for _, t := range f.Topics {
		if err := broker.CheckTopicConfig(t.Config, f.Defaults); err != nil {
			return nil, fail(t.Line, "topic %s: %v", t.Name, err)
		}
	}
	return f, nil
}

// scalar is a flag's value: a scalar as written, or a sequence of
// scalars joined by commas (the flags' list form).
func scalar(v *yaml.Node) (string, error) {
	switch v.Kind {
	case yaml.ScalarNode:
		if v.Tag == "!!null" {
			return "", nil
		}
		return v.Value, nil
	case yaml.SequenceNode:
		parts := make([]string, 0, len(v.Content))
		for _, e := range v.Content {
			if e.Kind != yaml.ScalarNode {
				return "", errors.New("a list of plain values is expected")
			}
			parts = append(parts, e.Value)
		}
		return strings.Join(parts, ","), nil
	}
	return "", errors.New("a value or a list of values is expected, not a mapping")
}

func (f *File) parseTopics(v *yaml.Node, fail func(int, string, ...any) error) error {
	if v.Kind != yaml.MappingNode {
		if v.Tag == "!!null" {
			return nil
		}
		return fail(v.Line, "topics must map each topic name to its configs")
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, c := v.Content[i], v.Content[i+1]
		if err := broker.ValidateTopicName(k.Value); err != nil {
			return fail(k.Line, "topic %q: %v", k.Value, err)
		}
		if first, dup := seen[k.Value]; dup {
			return fail(k.Line, "topic %s is declared twice (first on line %d)", k.Value, first)
		}
		seen[k.Value] = k.Line
		ce, err := cloudEventsMode(c, fail)
		if err != nil {
			return err
		}
		cfg, partsLine, allow, err := parseTopicConfig(c, fail, true)
		if err != nil {
			return err
		}
		f.Topics = append(f.Topics, Topic{Name: k.Value, Line: k.Line, Config: cfg, PartitionsLine: partsLine, AllowRepartition: allow, CloudEvents: ce})
	}
	return nil
}

// parseShareGroups reads share-groups: each group id maps the share
// group configs it sets, checked by the rules IncrementalAlterConfigs
// applies on the group resource. A .ms config may be written as a Go
// duration (15s).
func (f *File) parseShareGroups(v *yaml.Node, fail func(int, string, ...any) error) error {
	if v.Kind != yaml.MappingNode {
		if v.Tag == "!!null" {
			return nil
		}
		return fail(v.Line, "share-groups must map each share group id to its configs")
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, c := v.Content[i], v.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Value == "" {
			return fail(k.Line, "a share group id is a non-empty name")
		}
		if first, dup := seen[k.Value]; dup {
			return fail(k.Line, "share group %s is declared twice (first on line %d)", k.Value, first)
		}
		seen[k.Value] = k.Line
		g := ShareGroup{Name: k.Value, Line: k.Line}
		if c.Kind != yaml.MappingNode {
			if c.Tag != "!!null" {
				return fail(c.Line, "share group %s: a mapping of share group configs (share.record.lock.duration.ms: ..., share.delivery.count.limit: ...) is expected", k.Value)
			}
		}
		keys := map[string]int{}
		for j := 0; c.Kind == yaml.MappingNode && j+1 < len(c.Content); j += 2 {
			ck, cv := c.Content[j], c.Content[j+1]
			if first, dup := keys[ck.Value]; dup {
				return fail(ck.Line, "%s is set twice (first on line %d)", ck.Value, first)
			}
			keys[ck.Value] = ck.Line
			if !slices.Contains(protocol.ShareGroupConfigNames, ck.Value) {
				return fail(ck.Line, "share group %s: unknown share group config %q (known: %s)", k.Value, ck.Value, strings.Join(protocol.ShareGroupConfigNames, ", "))
			}
			if cv.Kind != yaml.ScalarNode || cv.Tag == "!!null" {
				return fail(cv.Line, "share group %s: %s: a single value is expected", k.Value, ck.Value)
			}
			s := cv.Value
			if strings.HasSuffix(ck.Value, ".ms") {
				s = millis(s)
			}
			if err := protocol.ValidateShareGroupConfig(ck.Value, s); err != nil {
				return fail(cv.Line, "share group %s: %v", k.Value, err)
			}
			g.Configs = append(g.Configs, protocol.ShareGroupConfig{Name: ck.Value, Value: s})
		}
		f.ShareGroups = append(f.ShareGroups, g)
	}
	return nil
}

// parseTopicConfig reads a mapping of Kafka config names (and, for a
// topic, partitions and allow-repartition) into a TopicConfig.
func parseTopicConfig(v *yaml.Node, fail func(int, string, ...any) error, topic bool) (cfg broker.TopicConfig, partsLine int, allow bool, err error) {
	if v.Tag == "!!null" {
		return cfg, 0, false, nil
	}
	if v.Kind != yaml.MappingNode {
		return cfg, 0, false, fail(v.Line, "a mapping of topic configs (retention.ms: ..., cleanup.policy: ...) is expected")
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, val := v.Content[i], v.Content[i+1]
		if first, dup := seen[k.Value]; dup {
			return cfg, 0, false, fail(k.Line, "%s is set twice (first on line %d)", k.Value, first)
		}
		seen[k.Value] = k.Line
		s, serr := scalar(val)
		if serr != nil || val.Kind != yaml.ScalarNode {
			return cfg, 0, false, fail(val.Line, "%s: a single value is expected", k.Value)
		}
		switch k.Value {
		case KeyCloudEvents:
			if !topic {
				return cfg, 0, false, fail(k.Line, "cloudevents is set per topic, or as the cloudevents setting (--cloudevents)")
			}
			continue
		case "partitions":
			if !topic {
				return cfg, 0, false, fail(k.Line, "partitions of topics created on first use is the partitions setting (--partitions), not a topic default")
			}
			n, perr := strconv.ParseInt(s, 10, 32)
			if perr != nil || n < 1 {
				return cfg, 0, false, fail(val.Line, "partitions %q: a positive count is expected", s)
			}
			cfg.Partitions, partsLine = int32(n), k.Line
			continue
		case "allow-repartition":
			if !topic {
				return cfg, 0, false, fail(k.Line, "allow-repartition is set per topic, or as the allow-repartition setting")
			}
			b, berr := strconv.ParseBool(s)
			if berr != nil {
				return cfg, 0, false, fail(val.Line, "allow-repartition %q: true or false is expected", s)
			}
			allow = b
			continue
		}
		name, ok := broker.FindTopicConfig(k.Value)
		if !ok {
			return cfg, 0, false, fail(k.Line, "unknown topic config %q (known: %s)", k.Value, knownConfigs(topic))
		}
		if name.Duration {
			s = millis(s)
		}
		if err := name.Set(&cfg, s); err != nil {
			return cfg, 0, false, fail(val.Line, "%v", err)
		}
	}
	return cfg, partsLine, allow, nil
}

// millis turns a Go duration ("24h", "90s") into milliseconds; any other
// value is left for the config's own parsing.
func millis(s string) string {
	if _, err := strconv.ParseInt(s, 10, 64); err == nil {
		return s
	}
	if d, err := time.ParseDuration(s); err == nil {
		return strconv.FormatInt(d.Milliseconds(), 10)
	}
	return s
}

// KeyCloudEvents is a declared topic's CloudEvents mode; it is the
// relay's, not the broker's, and it takes effect at the next start.
const KeyCloudEvents = "cloudevents"

// cloudEventsMode reads a topic's cloudevents key, "" when absent.
func cloudEventsMode(v *yaml.Node, fail func(int, string, ...any) error) (string, error) {
	if v.Kind != yaml.MappingNode {
		return "", nil
	}
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, val := v.Content[i], v.Content[i+1]
		if k.Value != KeyCloudEvents {
			continue
		}
		if val.Kind != yaml.ScalarNode {
			return "", fail(val.Line, "cloudevents: off, binary or structured is expected")
		}
		if err := relay.ValidCloudEventsMode(val.Value); err != nil {
			return "", fail(val.Line, "%v", err)
		}
		return val.Value, nil
	}
	return "", nil
}

func knownConfigs(topic bool) string {
	var names []string
	if topic {
		names = append(names, "partitions", "allow-repartition", KeyCloudEvents)
	}
	for _, n := range broker.TopicConfigNames {
		names = append(names, n.Name)
	}
	return strings.Join(names, ", ")
}
