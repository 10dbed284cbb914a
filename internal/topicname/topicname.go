// Package topicname holds Kafka's rules for topic names: the one check the
// core (a row's topic), the embedded broker and the Kafka sink share.
package topicname

import "fmt"

// MaxLen is the longest topic name Kafka accepts.
const MaxLen = 249

// Check returns nil for a valid Kafka topic name: 1 to 249 characters of
// [a-zA-Z0-9._-], and neither "." nor "..". Its error names the rule that
// failed; callers wrap it in their own sentinel.
func Check(name string) error {
	if len(name) == 0 || len(name) > MaxLen {
		return fmt.Errorf("%q: a topic name has 1 to %d characters, this one %d", name, MaxLen, len(name))
	}
	if name == "." || name == ".." {
		return fmt.Errorf("%q is not a topic name", name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%q: character %q is not one of [a-zA-Z0-9._-]", name, c)
		}
	}
	return nil
}
