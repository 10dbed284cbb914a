// Package topicname holds Kafka's rules for topic names: the one check the
// core (a row's topic), the embedded broker and the Kafka sink share.
package topicname

import "fmt"

// Kafka's internal topics: no event may name them (Kafka refuses clients'
// writes to them), and the embedded broker's listener lists
// __consumer_offsets as Kafka does, marked internal.
const (
	ConsumerOffsets  = "__consumer_offsets"
	TransactionState = "__transaction_state"
)

// MaxLen is the longest topic name Kafka accepts.
const MaxLen = 249

// Check returns nil for a valid Kafka topic name: 1 to 249 characters of
// [a-zA-Z0-9._-], neither "." nor "..", and not an internal topic. Its error names the rule that
// failed; callers wrap it in their own sentinel.
func Check(name string) error {
	if len(name) == 0 || len(name) > MaxLen {
		return fmt.Errorf("%q: a topic name has 1 to %d characters, this one %d", name, MaxLen, len(name))
	}
	if name == "." || name == ".." {
		return fmt.Errorf("%q is not a topic name", name)
	}
	if name == ConsumerOffsets || name == TransactionState {
		return fmt.Errorf("%q is one of Kafka's internal topics", name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%q: character %q is not one of [a-zA-Z0-9._-]", name, c)
		}
	}
	return nil
}
