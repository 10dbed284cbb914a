package relay

// The leader's maintenance services: the backlog sampler (backlog.go),
// the held-key sampler (hold.go), the readiness heartbeat (heartbeat.go)
// and the archive pruner (replayer.go). Each is a service with a Start and
// a Stop, run by the pipeline for as long as it runs; each pass runs its
// statements under a deadline (passDeadline), so a statement stuck on a
// lock or a dead connection ends and the next pass tries again rather
// than the loop hanging. None of them carries a guarantee: a failed pass
// changes nothing but leaves its gauge as the last pass set it, so a
// failure is counted in relay_maintenance_errors_total{service, kind},
// the time of the last good pass is
// relay_maintenance_last_success_timestamp_seconds{service}, and the log
// says it once per kind of failure (a Warn when the kind changes, an
// Info when passes succeed again), not at every tick.
//
// Tests wait for passes instead of sleeping: a service's TestSignals,
// nil in production, receive each pass's outcome
// (TestMaintenanceErrorsSurface).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// maintenanceSignals are a service's test hooks. A pass sends its outcome
// on Pass without blocking (a full or nil channel drops it).
type maintenanceSignals struct {
	Pass chan error
}

// Init makes the channels, buffered so that a test that reads late misses
// nothing recent.
func (s *maintenanceSignals) Init() {
	s.Pass = make(chan error, 64)
}

func (s *maintenanceSignals) pass(err error) {
	if s == nil || s.Pass == nil {
		return
	}
	select {
	case s.Pass <- err:
	default:
	}
}

// maintenance is one service: pass runs every interval (the first at
// Start) with a context that ends after deadline. A pass is one query (or
// one short transaction); one that reports again (the pruner's full
// batch) is followed by the next at once.
type maintenance struct {
	name     string
	every    time.Duration
	deadline time.Duration
	pass     func(ctx context.Context) (again bool, err error)
	log      *slog.Logger
	m        *Metrics
	// begin, when set, runs at each Start, before the first pass.
	begin func()

	// TestSignals are nil in production.
	TestSignals *maintenanceSignals

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
	// failing is the kind of the last failed pass, "" after a good one;
	// only the service's goroutine touches it.
	failing string
}

// passDeadline is how long a pass of a service that runs every interval
// may take: the interval, within a second and half a minute.
func passDeadline(every time.Duration) time.Duration {
	return min(max(every, time.Second), 30*time.Second)
}

func newMaintenance(name string, every time.Duration, log *slog.Logger, m *Metrics, pass func(context.Context) (bool, error)) *maintenance {
	return &maintenance{name: name, every: every, deadline: passDeadline(every), pass: pass, log: log, m: m}
}

// Start runs the service until Stop or until ctx ends. Starting a service
// that runs is an error.
func (s *maintenance) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done != nil {
		return fmt.Errorf("maintenance service %s is already running", s.name)
	}
	if s.begin != nil {
		s.begin()
	}
	ctx, s.cancel = context.WithCancel(ctx)
	s.done = make(chan struct{})
	go s.run(ctx, s.done)
	return nil
}

// Stop ends the service and returns once its pass, if one runs, has
// returned. Stopping a service that does not run does nothing.
func (s *maintenance) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done == nil {
		return
	}
	s.cancel()
	<-s.done
	s.cancel, s.done = nil, nil
}

func (s *maintenance) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(s.every)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, s.deadline)
		again, err := s.pass(pctx)
		cancel()
		if ctx.Err() != nil {
			return // stopped: a pass cut short is no failure
		}
		s.report(err)
		if again && err == nil {
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// report counts, logs and signals one pass's outcome.
func (s *maintenance) report(err error) {
	defer s.TestSignals.pass(err)
	if err == nil {
		s.m.MaintenanceOK.WithLabelValues(s.name).SetToCurrentTime()
		if s.failing != "" {
			s.log.Info("maintenance service recovered", "service", s.name, "failed_with", s.failing)
			s.failing = ""
		}
		return
	}
	kind := errorKind(err)
	s.m.MaintenanceErrors.WithLabelValues(s.name, kind).Inc()
	if kind != s.failing {
		s.log.Warn("maintenance service failing; its metric is stale until a pass succeeds (logged once per kind of error)",
			"service", s.name, "kind", kind, "err", err)
		s.failing = kind
	}
}

// errorKind names a failure for the metric's label and the log's
// once-per-kind: "timeout" (the pass's deadline), "sqlstate_<code>" (an
// error from PostgreSQL), "connection" (anything else: the connection or
// the pool).
func errorKind(err error) string {
	var pe *pgconn.PgError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.As(err, &pe):
		if pe.Code == "57014" { // query_canceled: the deadline, server side
			return "timeout"
		}
		return "sqlstate_" + pe.Code
	}
	return "connection"
}

// services are the leader's maintenance services (made by New, started
// by each pipeline session).
type services struct {
	backlog, holds, heartbeat, prune *maintenance
}

func (r *Relay) initServices() {
	once := func(pass func(context.Context) error) func(context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) { return false, pass(ctx) }
	}
	sample, begin := r.backlogSampler()
	r.svc.backlog = newMaintenance("backlog", r.cfg.BacklogInterval, r.log, r.m, once(sample))
	r.svc.backlog.begin = begin
	r.svc.holds = newMaintenance("holds", r.cfg.BacklogInterval, r.log, r.m, once(r.sampleHolds))
	r.svc.heartbeat = newMaintenance("heartbeat", r.cfg.heartbeatInterval(), r.log, r.m, once(r.sendHeartbeat))
	r.svc.prune = newMaintenance("prune", r.cfg.PruneInterval, r.log, r.m, r.archivePruner())
}

// startServices starts the services this configuration runs, under ctx;
// the returned function stops them and returns once they all have.
func (r *Relay) startServices(ctx context.Context) (stop func(), err error) {
	run := []*maintenance{r.svc.backlog, r.svc.holds}
	if r.cfg.ReadyTimeout > 0 {
		run = append(run, r.svc.heartbeat)
	}
	if r.cfg.Retain > 0 {
		run = append(run, r.svc.prune)
	}
	stop = func() {
		for _, s := range run {
			s.Stop()
		}
	}
	for _, s := range run {
		if err := s.Start(ctx); err != nil {
			stop()
			return nil, err
		}
	}
	return stop, nil
}
