package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/relay/internal/jitter"
	"github.com/outboxrelay/relay/internal/pgconfig"
	"github.com/outboxrelay/relay/migrations"
)

// Role is what a Relay is doing.
type Role string

const (
	RoleStarting Role = "starting"
	RoleStandby  Role = "standby"
	RoleLeader   Role = "leader"
	RoleStopped  Role = "stopped"
)

// Relay moves events from a Source to a Sink while it holds the outbox's
// leadership (see leadership.go).
type Relay struct {
	cfg    Config
	source Source
	sink   Sink
	log    *slog.Logger
	m      *Metrics

	pool *pgxpool.Pool

	// maxLatency and maxCommitLatency are touched only by the goroutine
	// that waits for durability.
	maxLatency, maxCommitLatency time.Duration
	// dwell caches each topic's dwell histogram; touched by the same
	// goroutine.
	dwell map[string]prometheus.Observer

	role    atomic.Value // Role
	lastErr atomic.Pointer[error]

	// store runs every statement of the core (storage.go).
	store storage
	// holds are the held keys (hold.go), beats the readiness heartbeats
	// (heartbeat.go).
	holds holds
	beats *heartbeats
	// svc are the maintenance services (maintenance.go).
	svc services
	// holder names this process in the leadership table.
	holder string
	// ledEpoch is the epoch this relay last led with (0 before it led);
	// only Run's goroutine touches it.
	ledEpoch int64
	// published counts acknowledged live events, for the drain rate.
	published atomic.Int64
	// fullPage is when the reader last read a full page, or nil after a
	// short one: while it is recent a backlog is being read, and
	// acknowledgements merge over a longer interval (ackInterval).
	fullPage atomic.Pointer[time.Time]
	// waiting holds the topics the destination refuses for now.
	waiting waiting
	// cloudEvents: some topic is presented as CloudEvents.
	cloudEvents bool
}

// New returns a Relay; Run starts it.
func New(cfg Config, source Source, sink Sink) (*Relay, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Relay{
		cfg: cfg, source: source, sink: sink, log: cfg.Logger, m: cfg.Metrics,
		store:       storageOf(cfg.Schema),
		holds:       holds{by: map[holdKey]int64{}},
		cloudEvents: cfg.CloudEvents.on(),
	}
	r.initHeartbeats()
	r.initServices()
	r.holder = holderName()
	r.role.Store(RoleStarting)
	return r, nil
}

// Role reports what the relay is doing now.
func (r *Relay) Role() Role { return r.role.Load().(Role) }

// Run elects a leader and runs the pipeline until ctx ends. Cancelling ctx
// is a graceful stop: the in-flight batch is published and acknowledged
// (within ShutdownTimeout) before Run returns. Run returns nil after a
// graceful stop.
func (r *Relay) Run(ctx context.Context) error {
	defer r.role.Store(RoleStopped)
	if s, ok := r.sink.(StandbySink); ok {
		defer s.Shutdown(context.WithoutCancel(ctx))
	}
	pool, err := r.connectPool(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while connecting: a graceful stop
		}
		return err
	}
	r.pool = pool
	defer pool.Close()
	var b backoff
	for {
		started := time.Now()
		err := r.checkSchema(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			break
		}
		if errors.Is(err, migrations.ErrPending) || errors.Is(err, migrations.ErrSchemaTooNew) || pgconfig.Refused(err) {
			return err
		}
		// No answer: the connection was refused or lost, or the server
		// is restarting. Ask again, as every later step does.
		wait := b.next(time.Since(started))
		r.log.Warn("checking the schema version failed; trying again", "err", err, "retry_in", wait)
		if sleepCtx(ctx, wait) != nil {
			return nil
		}
	}
	b = backoff{}
	for ctx.Err() == nil {
		started := time.Now()
		err := r.leadOnce(ctx, &b)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			continue
		}
		r.lastErr.Store(&err)
		wait := b.next(time.Since(started))
		r.log.Error("relay stopped leading; trying again", "err", err, "retry_in", wait)
		if sleepCtx(ctx, wait) != nil {
			return nil
		}
	}
	return nil
}

// backoff is the wait before a restart: 200 ms doubling to 10 s while
// failures follow each other, and short again after a run that lasted
// healthyRun; each wait is spread over its upper half (jitter.Spread), so
// relays that lost the database together do not retry in step.
type backoff struct{ d time.Duration }

const healthyRun = 30 * time.Second

func (b *backoff) next(ran time.Duration) time.Duration {
	if ran >= healthyRun {
		b.d = 0
	}
	b.d = min(max(2*b.d, 200*time.Millisecond), 10*time.Second)
	return jitter.Spread(b.d)
}

func (r *Relay) connectPool(ctx context.Context) (*pgxpool.Pool, error) {
	return pgconfig.NewPool(ctx, r.cfg.DatabaseURL, 4, func(c *pgx.ConnConfig) {
		c.RuntimeParams["application_name"] = ApplicationName
		// A transaction left open by a paused relay must not hold the
		// leadership row (or the outbox's rows) past its lease.
		c.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.FormatInt(r.cfg.Lease.Milliseconds(), 10)
		// The core's statements are short index lookups and writes; a
		// plan misjudged over a queue's passing statistics must not cost
		// a JIT compilation (hundreds of milliseconds) on the hot path.
		c.RuntimeParams["jit"] = "off"
	})
}

// checkSchema refuses to run against a database that is not migrated to
// this binary's version, or ahead of it beyond the compatibility range its
// newer migrations record (migrations' package comment). Running on a
// compatible newer schema, during a rolling upgrade, is logged.
func (r *Relay) checkSchema(ctx context.Context) error {
	m, err := migrations.New(r.cfg.Schema)
	if err != nil {
		return err
	}
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return pgconfig.Wrap(err, r.cfg.DatabaseURL, "connecting to PostgreSQL")
	}
	defer conn.Release()
	st, err := m.Status(ctx, conn.Conn())
	if err != nil {
		return err
	}
	if err := m.CheckStatus(st); err != nil {
		return err
	}
	if st.Current > st.Latest {
		r.log.Warn("the schema was migrated by a newer relay whose migrations keep this one compatible; replace this relay with the newer release",
			"schema", st.Schema, "schema_version", st.Current, "relay_schema_version", st.Latest)
	}
	return nil
}

// leadOnce waits for the leadership and runs the pipeline while it holds
// the lease, restarting it after failures (the lease is kept meanwhile, so
// no standby waits for it to run out). It returns when the lease is lost,
// or nil after a graceful stop.
func (r *Relay) leadOnce(ctx context.Context, b *backoff) error {
	lc := &leaseConn{r: r}
	conn, err := lc.get(ctx)
	if err != nil {
		r.m.Errors.WithLabelValues("leader").Inc()
		return err
	}
	defer lc.close(context.WithoutCancel(ctx))
	l, err := r.acquire(ctx, conn)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		r.m.Errors.WithLabelValues("leader").Inc()
		return err
	}
	r.ledEpoch = l.epoch
	r.beats.lead()
	r.role.Store(RoleLeader)
	r.m.Leader.Set(1)
	defer r.m.Leader.Set(0)
	// Once the pipeline has stopped this relay no longer leads, whether or
	// not it can reach PostgreSQL to wait as a standby again.
	defer r.role.Store(RoleStandby)
	r.log.Info("became the leader", "schema", r.cfg.Schema, "epoch", l.epoch)

	// leading ends when the lease is lost; the pipeline's hard stop follows.
	leading, stopLeading := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopLeading(nil)
	keepDone := make(chan error, 1)
	keepCtx, stopKeep := context.WithCancel(ctx)
	go func() {
		err := r.keepLease(keepCtx, lc, l)
		if err != nil {
			stopLeading(err)
		}
		keepDone <- err
	}()
	for {
		started := time.Now()
		err = r.pipeline(ctx, leading, l)
		if ctx.Err() != nil || leading.Err() != nil {
			break
		}
		r.lastErr.Store(&err)
		wait := b.next(time.Since(started))
		r.log.Error("relay pipeline stopped; restarting", "err", err, "retry_in", wait)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
		case <-leading.Done():
		}
		t.Stop()
		if ctx.Err() != nil || leading.Err() != nil {
			break
		}
	}
	stopKeep()
	lost := <-keepDone
	if lost == nil && ctx.Err() != nil {
		r.release(context.WithoutCancel(ctx), lc, l)
	}
	if lost != nil {
		return lost
	}
	if ctx.Err() != nil && err == nil {
		r.lastErr.Store(nil)
	}
	return err
}

type checkpoint struct {
	position Position
	state    []byte
	// switched is set when the position was written by another kind of
	// reader: the source must drop whatever progress it keeps itself.
	switched bool
}

func (r *Relay) loadCheckpoint(ctx context.Context) (checkpoint, error) {
	var ck checkpoint
	saved, found, err := r.store.LoadCheckpoint(ctx, r.pool, r.cfg.Name)
	if err != nil {
		return ck, fmt.Errorf("loading the checkpoint: %w", err)
	}
	if !found {
		return ck, nil
	}
	ck.state = saved.State
	ck.position = Position{Major: uint64(saved.Major), Minor: uint64(saved.Minor)}
	if source := saved.Source; source != "" && source != r.cfg.SourceKind {
		r.log.Warn("the checkpoint was written by another reader; starting from the oldest unpublished row",
			"checkpoint_source", source, "source", r.cfg.SourceKind, "position", ck.position.String())
		ck.position, ck.switched = Position{}, true
	}
	return ck, nil
}
