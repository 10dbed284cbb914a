package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/jitter"
)

// DefaultSchema is the schema Migrate creates unless told otherwise.
const DefaultSchema = "inbox"

// EventIDHeader is the record header that carries the relay's event id.
const EventIDHeader = "relay-event-id"

// DB is what the inbox needs of the consumer's database: a *pgxpool.Pool.
// Partitions are processed side by side, so it must be safe for
// concurrent use (a single *pgx.Conn is not).
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Handler applies one record inside tx, the transaction that also records
// the record's event id as processed. It must do all of its database work
// through tx and must not commit or roll it back. An error rolls the
// transaction back; the record is tried again, up to Config.MaxAttempts,
// then dead-lettered. A handler may run more than once for a record (a
// rolled-back attempt, a rebalance): only its effects through tx are
// applied exactly once.
type Handler func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error

// Policy says what happens to a key's later records once one of its
// records is dead-lettered.
type Policy int

const (
	// SkipRecord dead-letters the failing record alone; the key's later
	// records are applied as they come.
	SkipRecord Policy = iota
	// HoldKey dead-letters the failing record and parks every later record
	// of its key (same topic) as held, until the dead letters of the key
	// are retried or discarded, so the key's order is never broken.
	// Records without a key are never held.
	HoldKey
)

// Config configures a Consumer. DB, Group, Topics, Handler and a seed
// broker in Kafka are required; zero fields take the defaults written on
// each.
type Config struct {
	DB DB
	// Schema holds the inbox tables (default DefaultSchema).
	Schema string
	// Group is the Kafka consumer group, and the inbox's namespace: two
	// groups consuming the same topic apply its events once each.
	Group  string
	Topics []string
	// Kafka holds the client's options: kgo.SeedBrokers and whatever the
	// cluster needs (TLS, SASL). The group, the topics, offset commits and
	// rebalance handling are the Consumer's; do not set them here.
	Kafka   []kgo.Opt
	Handler Handler
	// BatchSize is the number of records of one partition applied in one
	// transaction (default 1). A failing batch is retried record by record,
	// so a poison record is dead-lettered alone.
	BatchSize int
	// MaxAttempts is how many times a record's handler may fail before the
	// record is dead-lettered (default 5).
	MaxAttempts int
	// RetryBackoff is the pause after a record's first failed attempt
	// (default 100ms); it doubles, with jitter, up to 5s.
	RetryBackoff time.Duration
	// Policy is the dead-letter policy (default SkipRecord).
	Policy Policy
	// Concurrency is the number of partitions processed side by side
	// (default 8).
	Concurrency int
	// RetainFor is how long a processed event id is kept at least, even
	// once the group committed past it: the window in which a duplicate of
	// the event can still reach the topic (the relay's at-least-once
	// window). Set it to the topic's retention.ms or longer. Default 7
	// days, Kafka's default retention.
	RetainFor time.Duration
	// PruneInterval is how often processed ids are pruned in the
	// background (default 1 minute; negative: never, call Prune).
	PruneInterval time.Duration
	// EventID returns a record's identity (default: the relay-event-id
	// header). A record without one is dead-lettered: it cannot be applied
	// exactly once.
	EventID func(*kgo.Record) (string, error)
	Logger  *slog.Logger
	// Metrics receives the consumer's measurements (default: collectors
	// registered nowhere; see NewMetrics).
	Metrics *Metrics
}

func (c Config) withDefaults() Config {
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 1
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 5
	}
	if c.RetryBackoff <= 0 {
		c.RetryBackoff = 100 * time.Millisecond
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 8
	}
	if c.RetainFor == 0 {
		c.RetainFor = 7 * 24 * time.Hour
	}
	if c.PruneInterval == 0 {
		c.PruneInterval = time.Minute
	}
	if c.EventID == nil {
		c.EventID = HeaderEventID
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics(nil)
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.DB == nil:
		return errors.New("inbox: Config.DB is required")
	case c.Group == "":
		return errors.New("inbox: Config.Group is required")
	case len(c.Topics) == 0:
		return errors.New("inbox: Config.Topics is required")
	case c.Handler == nil:
		return errors.New("inbox: Config.Handler is required")
	case c.RetainFor < 0:
		return errors.New("inbox: Config.RetainFor must not be negative")
	case c.Policy != SkipRecord && c.Policy != HoldKey:
		return fmt.Errorf("inbox: unknown Policy %d", c.Policy)
	}
	return nil
}

// HeaderEventID is the default Config.EventID: the relay-event-id header.
func HeaderEventID(r *kgo.Record) (string, error) {
	for _, h := range r.Headers {
		if h.Key == EventIDHeader {
			if len(h.Value) == 0 {
				break
			}
			return string(h.Value), nil
		}
	}
	return "", fmt.Errorf("record has no %s header", EventIDHeader)
}

// Consumer consumes topics in a consumer group and applies each event
// exactly once to the consumer's database. See the package doc.
type Consumer struct {
	cfg Config
	sql statements
}

// New checks cfg and returns a Consumer; Run starts it.
func New(cfg Config) (*Consumer, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Consumer{cfg: cfg, sql: newStatements(cfg.Schema)}, nil
}

// Run consumes until ctx is done, then finishes or rolls back the records
// in flight, commits the offsets of what was applied, leaves the group and
// returns nil. It returns an error if the inbox schema is missing or the
// Kafka client cannot be made.
func (c *Consumer) Run(ctx context.Context) error {
	if err := checkSchema(ctx, c.cfg.DB, c.cfg.Schema); err != nil {
		return err
	}
	opts := append([]kgo.Opt{}, c.cfg.Kafka...)
	opts = append(opts,
		kgo.ConsumerGroup(c.cfg.Group),
		kgo.ConsumeTopics(c.cfg.Topics...),
		kgo.DisableAutoCommit(),
		// No rebalance runs while a poll's records are processed: a revoked
		// partition's work is committed (database, then offsets) before the
		// partition is given up.
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(c.forget),
		kgo.OnPartitionsLost(c.forget),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("inbox: kafka client: %w", err)
	}
	defer cl.Close()

	var wg sync.WaitGroup
	if c.cfg.PruneInterval > 0 {
		pruneCtx, stopPrune := context.WithCancel(ctx)
		defer func() { stopPrune(); wg.Wait() }()
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.pruneLoop(pruneCtx, cl)
		}()
	}

	for {
		fetches := cl.PollRecords(ctx, 10_000)
		if ctx.Err() != nil {
			cl.AllowRebalance()
			return nil
		}
		fetches.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				c.cfg.Logger.Warn("inbox: fetch failed", "topic", topic, "partition", p, "err", err)
			}
		})
		c.process(ctx, cl, fetches)
		cl.AllowRebalance()
	}
}

// forget drops the lag series of partitions this member no longer owns.
func (c *Consumer) forget(_ context.Context, _ *kgo.Client, parts map[string][]int32) {
	for topic, ps := range parts {
		for _, p := range ps {
			c.cfg.Metrics.forget(c.cfg.Group, topic, p)
		}
	}
}

// process applies one poll's records, partitions side by side and each
// partition in offset order, then commits the offsets of what was applied.
func (c *Consumer) process(ctx context.Context, cl *kgo.Client, fetches kgo.Fetches) {
	var (
		mu     sync.Mutex
		done   []*kgo.Record
		rewind = map[string]map[int32]kgo.EpochOffset{}
		wg     sync.WaitGroup
		sem    = make(chan struct{}, c.cfg.Concurrency)
	)
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			last, stuck := c.applyPartition(ctx, p.Records)
			mu.Lock()
			defer mu.Unlock()
			if last != nil {
				done = append(done, last)
				c.cfg.Metrics.lag(c.cfg.Group, p.Topic, p.Partition, p.HighWatermark-last.Offset-1)
			}
			if stuck != nil {
				if rewind[p.Topic] == nil {
					rewind[p.Topic] = map[int32]kgo.EpochOffset{}
				}
				rewind[p.Topic][p.Partition] = kgo.EpochOffset{Epoch: stuck.LeaderEpoch, Offset: stuck.Offset}
			}
		}()
	})
	wg.Wait()
	if len(rewind) > 0 {
		// Records after one not applied were fetched but must come again,
		// in order: move the fetch position back to the first of them.
		cl.SetOffsets(rewind)
	}
	if len(done) == 0 {
		return
	}
	// The offsets go after the database commits: a crash in between only
	// redelivers records whose ids are recorded, and they are skipped. The
	// commit outlives ctx so that a stop commits what it applied.
	commitCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := cl.CommitRecords(commitCtx, done...); err != nil {
		c.cfg.Logger.Warn("inbox: offset commit failed; the applied records will be redelivered and skipped", "err", err)
	}
}

// applyPartition applies recs, one partition's records in offset order, in
// transactions of up to BatchSize records. It returns the last record
// applied (or skipped, or dead-lettered), and the first record it could
// not settle, if any: the rest of recs is left for the next poll.
func (c *Consumer) applyPartition(ctx context.Context, recs []*kgo.Record) (last, stuck *kgo.Record) {
	for len(recs) > 0 {
		n := min(c.cfg.BatchSize, len(recs))
		chunk := recs[:n]
		if n > 1 {
			err := c.applyBatch(ctx, chunk)
			if err == nil {
				last, recs = chunk[n-1], recs[n:]
				continue
			}
			if ctx.Err() != nil {
				return last, chunk[0]
			}
			// One record spoiled the batch: go record by record so it is
			// tried and dead-lettered alone.
		}
		for _, r := range chunk {
			if err := c.applyOne(ctx, r); err != nil {
				if ctx.Err() == nil {
					c.cfg.Logger.Warn("inbox: record not applied; it will be fetched again", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", err)
				}
				return last, r
			}
			last = r
		}
		recs = recs[n:]
	}
	return last, nil
}

// applyBatch applies recs in one transaction; any failure rolls all back.
func (c *Consumer) applyBatch(ctx context.Context, recs []*kgo.Record) error {
	tx, err := c.cfg.DB.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var outcomes []outcome
	for _, r := range recs {
		o, err := c.applyInTx(ctx, tx, r)
		if err != nil {
			return err
		}
		outcomes = append(outcomes, o)
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	for i, o := range outcomes {
		c.count(recs[i], o)
	}
	return nil
}

type outcome int

const (
	applied outcome = iota
	duplicate
	held
)

// applyOne applies r in a transaction of its own, retrying a failing
// handler up to MaxAttempts and then dead-lettering r. It returns an error
// only when r is neither applied nor dead-lettered: the database is
// unreachable, or ctx ended.
func (c *Consumer) applyOne(ctx context.Context, r *kgo.Record) error {
	if _, err := c.cfg.EventID(r); err != nil {
		return c.deadLetter(ctx, r, 0, err.Error())
	}
	backoff := c.cfg.RetryBackoff
	failures, outages := 0, 0
	for {
		o, err := c.tryOne(ctx, r)
		if err == nil {
			c.count(r, o)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var he handlerError
		if errors.As(err, &he) && !c.databaseDown(ctx) {
			failures++
			if failures >= c.cfg.MaxAttempts {
				return c.deadLetter(ctx, r, failures, he.err.Error())
			}
		} else {
			// The database itself fails: the attempt is not the record's
			// fault and is not counted. After a few, the partition goes
			// back to the next poll.
			outages++
			if outages >= 5 {
				return err
			}
		}
		if err := sleep(ctx, jitter.Spread(backoff)); err != nil {
			return err
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// handlerError marks an error the handler returned, as opposed to one of
// the inbox's own statements.
type handlerError struct{ err error }

func (e handlerError) Error() string { return e.err.Error() }
func (e handlerError) Unwrap() error { return e.err }

func (c *Consumer) tryOne(ctx context.Context, r *kgo.Record) (outcome, error) {
	tx, err := c.cfg.DB.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	o, err := c.applyInTx(ctx, tx, r)
	if err != nil {
		return 0, err
	}
	return o, tx.Commit(ctx)
}

// applyInTx records r's event id in tx and, unless the id was recorded
// before or r's key is held, runs the handler in tx.
func (c *Consumer) applyInTx(ctx context.Context, tx pgx.Tx, r *kgo.Record) (outcome, error) {
	id, err := c.cfg.EventID(r)
	if err != nil {
		return 0, handlerError{err}
	}
	// The insert waits for a concurrent transaction that inserted the same
	// id (another member applying r after a rebalance) and then finds it:
	// whoever commits first applied r, the other skips it.
	tag, err := tx.Exec(ctx, c.sql.markProcessed, c.cfg.Group, id, r.Topic, r.Partition, r.Offset)
	if err != nil {
		return 0, err
	}
	if tag.RowsAffected() == 0 {
		return duplicate, nil
	}
	if c.cfg.Policy == HoldKey && r.Key != nil {
		var heldBy int64
		err := tx.QueryRow(ctx, c.sql.keyHeld, c.cfg.Group, r.Topic, r.Key).Scan(&heldBy)
		switch {
		case err == nil:
			if err := insertDeadLetter(ctx, tx, c.sql, c.cfg.Group, id, r, 0, fmt.Sprintf("held behind dead letter %d of the same key", heldBy), true); err != nil {
				return 0, err
			}
			return held, nil
		case !errors.Is(err, pgx.ErrNoRows):
			return 0, err
		}
	}
	ctx, end := c.startSpan(ctx, r, id)
	start := time.Now()
	err = c.cfg.Handler(ctx, tx, r)
	c.cfg.Metrics.handled(c.cfg.Group, r.Topic, time.Since(start))
	end(err)
	if err != nil {
		return 0, handlerError{err}
	}
	return applied, nil
}

func (c *Consumer) count(r *kgo.Record, o outcome) {
	switch o {
	case applied:
		c.cfg.Metrics.Applied.WithLabelValues(c.cfg.Group, r.Topic).Inc()
	case duplicate:
		c.cfg.Metrics.Duplicates.WithLabelValues(c.cfg.Group, r.Topic).Inc()
	case held:
		c.cfg.Metrics.DeadLettered.WithLabelValues(c.cfg.Group, r.Topic).Inc()
	}
}

// deadLetter records r as processed and dead, in one transaction.
func (c *Consumer) deadLetter(ctx context.Context, r *kgo.Record, attempts int, reason string) error {
	id, err := c.cfg.EventID(r)
	if err != nil {
		// No identity: the record's position stands in for it, so that the
		// dead letter is written once.
		id = fmt.Sprintf("no-id:%s/%d/%d", r.Topic, r.Partition, r.Offset)
	}
	tx, err := c.cfg.DB.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	tag, err := tx.Exec(ctx, c.sql.markProcessed, c.cfg.Group, id, r.Topic, r.Partition, r.Offset)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		// Another member applied or dead-lettered it meanwhile.
		return tx.Commit(ctx)
	}
	if err := insertDeadLetter(ctx, tx, c.sql, c.cfg.Group, id, r, attempts, reason, false); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	c.cfg.Logger.Error("inbox: record dead-lettered", "group", c.cfg.Group, "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "event_id", id, "attempts", attempts, "reason", reason)
	c.cfg.Metrics.DeadLettered.WithLabelValues(c.cfg.Group, r.Topic).Inc()
	return nil
}

// databaseDown reports whether the database fails a trivial query: a
// handler's error then says nothing about its record.
func (c *Consumer) databaseDown(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := c.cfg.DB.Exec(ctx, "SELECT 1")
	return err != nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
