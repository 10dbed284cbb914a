package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/relay"
)

// Config configures the sink.
type Config struct {
	// Broker are the options the broker is opened with; Dir is required.
	Broker broker.Options
	// OnOpen, when set, runs after the broker opens, and its returned
	// function before it closes: the Kafka listener attaches here. An error
	// fails Start.
	OnOpen func(*broker.Broker) (stop func(), err error)
	// WaitForTopics turns off the creation of topics on first use: events
	// for a topic the broker does not have wait in the outbox (Publish
	// returns a relay.DestinationError) until it is created, through the
	// Kafka listener's CreateTopics. Off, the default, creates them with
	// the broker's defaults.
	WaitForTopics bool
	Logger        *slog.Logger
}

// Sink publishes into the embedded broker.
type Sink struct {
	cfg Config

	mu     sync.Mutex
	b      *broker.Broker
	stopFn func()
	fence  func() error
	// inSession is true from Start to Close. Between sessions the broker
	// stays open (see "Between sessions"), watched by the goroutine that
	// lingerStop ends and lingerDone reports.
	inSession bool
	// placements is the session's relay.Session.Placements: results
	// report each message's partition and offset.
	placements             bool
	lingerStop, lingerDone chan struct{}
	// reopen makes the next Start open the broker anew (a topic deleted
	// since it opened is wanted again).
	reopen bool
	// failure is the last Publish error, until a Publish succeeds; it
	// survives restarts of the sink.
	failure error

	// The fields below belong to the goroutine that calls PublishAsync.
	id broker.ProducerID
	st state
	// seq is the next sequence per partition in this session.
	seq map[tp]int32
	// appenders are the append workers' scratch (see "Appends side by
	// side"), reused from batch to batch.
	appenders []appender
	// groups and groupOf are PublishAsync's grouping of a batch by
	// partition, kept with their index slices from batch to batch for the
	// same reason: at 1,000 topics a batch has a group for nearly every
	// event.
	groups  []group
	groupOf map[tp]int
	// firstSeq is where a partition's sequence starts in a session (0; the
	// tests start near the wrap points).
	firstSeq int32
	// seen holds the identities of the relay's records that the log holds
	// after the acknowledged offsets, found at Start, and where each is,
	// until the source offers it again.
	seen map[string]logPos
	// held is what seen held at Start, each until the batch that offered
	// it again is durable; the saved state names where they are (Held),
	// so that the next Start finds them again (see "Exactly once, by
	// identity", step 2).
	held map[string]logPos
	// topics caches topic settings, until the broker's ConfigVersion
	// moves.
	topics map[string]broker.TopicConfig
	// topicsVersion is the broker's ConfigVersion topics was filled at.
	topicsVersion int64
}

// maxEncodeBuffer is the largest encoding buffer kept for reuse.
const maxEncodeBuffer = 8 << 20

// Appends side by side (see the package doc): a batch's partition groups
// are split among up to appendWorkers goroutines, one per groupsPerWorker
// groups, which take appendChunk groups at a time.
const (
	appendWorkers   = 4
	groupsPerWorker = 64
	appendChunk     = 16
)

// producerName is the broker's internal producer the relay writes as.
const producerName = "relay"

var _ relay.PipelinedSink = (*Sink)(nil)

// New returns a sink; Start opens the broker.
func New(cfg Config) (*Sink, error) {
	if cfg.Broker.Dir == "" {
		return nil, errors.New("embedded sink: a data directory is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Sink{cfg: cfg}, nil
}

// Broker returns the open broker (in a session, or kept open between
// sessions), or nil.
func (s *Sink) Broker() *broker.Broker {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b
}

func (s *Sink) setFailure(err error) {
	s.mu.Lock()
	s.failure = err
	s.mu.Unlock()
}

// Ready reports whether the broker is open and its storage sound (an fsync
// error stops acknowledgements until the broker is reopened from disk), and
// the last Publish, if it failed (a full disk, say), has since succeeded.
func (s *Sink) Ready(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b == nil {
		return errors.New("embedded broker is not open")
	}
	if !s.inSession {
		return errors.New("embedded sink: between sessions (the relay is not publishing)")
	}
	if err := s.b.Health(); err != nil {
		return fmt.Errorf("embedded broker: %w", err)
	}
	if s.failure != nil {
		return fmt.Errorf("the last publish failed: %w", s.failure)
	}
	return nil
}

// Close ends the session. The broker stays open, serving the Kafka
// listener's consumers, until Shutdown, the next Start needs it reopened,
// or another process asks for the data directory (see "Between
// sessions").
func (s *Sink) Close(context.Context) error {
	s.mu.Lock()
	was := s.inSession
	s.inSession, s.fence = false, nil
	open := s.b != nil
	s.mu.Unlock()
	if was && open {
		s.startLinger()
	}
	return nil
}

// Shutdown closes the broker and the listener hook: when the relay stops.
func (s *Sink) Shutdown(ctx context.Context) error {
	s.Close(ctx)
	s.stopLinger()
	return s.closeBroker()
}

// closeBroker stops the listener hook and closes the broker, if open.
func (s *Sink) closeBroker() error {
	s.mu.Lock()
	b, stop := s.b, s.stopFn
	s.b, s.stopFn, s.fence, s.inSession = nil, nil, nil, false
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
	if b == nil {
		return nil
	}
	return b.Close()
}
