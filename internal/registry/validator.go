package registry

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/outboxrelay/relay/relay"
)

// HeaderSchemaVersion is the row header that names the subject version an
// event's payload was written with; without it the latest version applies.
const HeaderSchemaVersion = "schema-version"

// SubjectOf is the subject of a topic's values (Confluent's
// TopicNameStrategy): "<topic>-value".
func SubjectOf(topic string) string { return topic + "-value" }

// ValidatorConfig configures a Validator.
type ValidatorConfig struct {
	Store *Store
	// Topics have a contract: each event's payload must match the latest
	// version of the topic's subject (or the one its schema-version
	// header names), and a topic whose subject has no version rejects
	// every event. "*" gives every topic whose subject has a version a
	// contract, and lets the others through.
	Topics []string
	// Frame publishes values in the Confluent wire format: a zero byte,
	// the schema id (4 bytes, big-endian), for Protobuf the index of the
	// message in the file (a zero byte: the first), then the payload.
	Frame bool
}

// Validator implements relay.Validator over the registry's live versions.
type Validator struct {
	store  *Store
	topics map[string]bool
	all    bool
	frame  bool
	snap   atomic.Pointer[snapshot]
	// mu serializes Refresh.
	mu sync.Mutex
}

type compiled struct {
	subject string
	version int
	id      int
	schema  Schema
	// err: the stored schema no longer parses (a newer relay wrote it).
	err error
}

type snapshot struct {
	generation int64
	latest     map[string]*compiled
	versions   map[string]map[int]*compiled
	byID       map[int]Schema
}

// NewValidator returns a validator; its first Refresh loads the contracts.
func NewValidator(cfg ValidatorConfig) *Validator {
	v := &Validator{store: cfg.Store, topics: map[string]bool{}, frame: cfg.Frame}
	for _, t := range cfg.Topics {
		if t == "*" {
			v.all = true
		} else {
			v.topics[t] = true
		}
	}
	return v
}

// Refresh reloads the live versions when the registry's generation moved.
func (v *Validator) Refresh(ctx context.Context) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	old := v.snap.Load()
	if old != nil {
		g, err := v.store.Generation(ctx)
		if err != nil {
			return err
		}
		if g == old.generation {
			return nil
		}
	}
	live, gen, err := v.store.live(ctx)
	if err != nil {
		return err
	}
	s := &snapshot{generation: gen, latest: map[string]*compiled{}, versions: map[string]map[int]*compiled{}, byID: map[int]Schema{}}
	for _, lv := range live {
		c := &compiled{subject: lv.Subject, version: lv.Version, id: lv.ID}
		if old != nil && old.byID[lv.ID] != nil {
			c.schema = old.byID[lv.ID]
		} else {
			c.schema, c.err = Parse(lv.Type, lv.Schema)
		}
		if c.err == nil {
			s.byID[lv.ID] = c.schema
		}
		if s.versions[lv.Subject] == nil {
			s.versions[lv.Subject] = map[int]*compiled{}
		}
		s.versions[lv.Subject][lv.Version] = c
		s.latest[lv.Subject] = c
	}
	v.snap.Store(s)
	return nil
}

// contract returns the version msg's payload must match: nil with a nil
// error when no contract applies.
func (v *Validator) contract(msg relay.Message) (*compiled, error) {
	if !v.all && !v.topics[msg.Topic] {
		return nil, nil
	}
	s := v.snap.Load()
	if s == nil {
		return nil, fmt.Errorf("the schema contracts were not loaded")
	}
	subject := SubjectOf(msg.Topic)
	c := s.latest[subject]
	if c == nil {
		if v.all {
			return nil, nil
		}
		return nil, fmt.Errorf("topic %q has a contract but subject %q has no registered schema", msg.Topic, subject)
	}
	for _, h := range msg.Headers {
		if h.Key != HeaderSchemaVersion {
			continue
		}
		n, err := strconv.Atoi(string(h.Value))
		if err != nil {
			return nil, fmt.Errorf("header %s is %q, not a version number", HeaderSchemaVersion, h.Value)
		}
		if c = s.versions[subject][n]; c == nil {
			return nil, fmt.Errorf("header %s names version %d, which subject %q does not have", HeaderSchemaVersion, n, subject)
		}
	}
	return c, nil
}

// SchemaID implements relay.SchemaIdentifier: the id of the schema msg's
// contract checks it against (the CloudEvents dataschema).
func (v *Validator) SchemaID(msg relay.Message) (int, bool) {
	c, err := v.contract(msg)
	if c == nil || err != nil {
		return 0, false
	}
	return c.id, true
}

// Validate checks msg against its topic's contract.
func (v *Validator) Validate(msg relay.Message) ([]byte, error) {
	c, err := v.contract(msg)
	if err != nil {
		return nil, err
	}
	if c == nil {
		return msg.Value, nil
	}
	subject := c.subject
	if c.err != nil {
		return nil, fmt.Errorf("version %d of subject %q cannot be used: %w", c.version, subject, c.err)
	}
	if err := c.schema.Validate(msg.Value); err != nil {
		return nil, fmt.Errorf("the payload breaks the contract of %q version %d (schema id %d): %w", subject, c.version, c.id, err)
	}
	if !v.frame {
		return msg.Value, nil
	}
	head := 5
	if c.schema.Type() == TypeProtobuf {
		head = 6
	}
	framed := make([]byte, head+len(msg.Value))
	binary.BigEndian.PutUint32(framed[1:5], uint32(c.id))
	copy(framed[head:], msg.Value)
	return framed, nil
}
