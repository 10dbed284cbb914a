package protocol

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// budget is a server-wide allowance of bytes held: one for requests being
// read and handled, one for fetch responses until they are written, each
// half of Config.MaxInFlightBytes. A waiter takes its bytes as soon as
// they are free, not in arrival order: a large frame waiting for room
// does not hold up the small requests behind it (a strict queue would
// stall every client behind one large frame while another client trickles
// its own); under a steady stream of small requests a large one may wait
// longer.
type budget struct {
	total int64
	used  atomic.Int64

	mu      sync.Mutex
	held    int64
	changed chan struct{}
}

func newBudget(total int64) *budget {
	if total <= 0 {
		return nil
	}
	return &budget{total: total, changed: make(chan struct{})}
}

// acquire blocks until n bytes are free or ctx ends (nil budget: at
// once).
func (b *budget) acquire(ctx context.Context, n int64) error {
	if b == nil || n <= 0 {
		return nil
	}
	for {
		b.mu.Lock()
		if b.held+n <= b.total {
			b.held += n
			b.used.Store(b.held)
			b.mu.Unlock()
			return nil
		}
		ch := b.changed
		b.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (b *budget) release(n int64) {
	if b == nil || n <= 0 {
		return
	}
	b.mu.Lock()
	b.held -= n
	b.used.Store(b.held)
	close(b.changed)
	b.changed = make(chan struct{})
	b.mu.Unlock()
}

// fetchReserve is what one fetch response may hold of the responses'
// budget: half of it.
func (b *budget) fetchReserve() int64 {
	if b == nil {
		return 0
	}
	return max(b.total/2, 1)
}

// refusalLogInterval is how often, at most, the listener logs that it
// refused connections over one limit; the refusals in between are
// counted in the next line (and always in the metric).
const refusalLogInterval = 10 * time.Second

// refusalLog rate-limits the log lines of refused connections: one per
// limit per refusalLogInterval, naming the limit, the address of the
// refusal that logged and how many were refused since the last line.
type refusalLog struct {
	mu         sync.Mutex
	last       map[string]time.Time
	suppressed map[string]int64
}

// note reports whether the refusal over limit should be logged now, and
// how many refusals over it went unlogged before it.
func (r *refusalLog) note(limit string, now time.Time) (log bool, unlogged int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last, r.suppressed = map[string]time.Time{}, map[string]int64{}
	}
	if last, ok := r.last[limit]; ok && now.Sub(last) < refusalLogInterval {
		r.suppressed[limit]++
		return false, 0
	}
	unlogged = r.suppressed[limit]
	r.last[limit], r.suppressed[limit] = now, 0
	return true, unlogged
}

// admit counts nc against the connection limits; false means it must be
// closed at once. Callers release admitted connections with leave.
// Refusals are counted in the metric and logged (rate-limited) with the
// limit and the address.
func (s *Server) admit(nc net.Conn) bool {
	host := remoteHost(nc)
	s.mu.Lock()
	var limit string
	var value, open int
	switch {
	case s.cfg.MaxConnections > 0 && s.open >= s.cfg.MaxConnections:
		s.stats.refusedTotal.Add(1)
		limit, value, open = "total", s.cfg.MaxConnections, s.open
	case s.cfg.MaxConnectionsPerAddress > 0 && s.perHost[host] >= s.cfg.MaxConnectionsPerAddress:
		s.stats.refusedPerAddress.Add(1)
		limit, value, open = "per_address", s.cfg.MaxConnectionsPerAddress, s.perHost[host]
	default:
		s.open++
		s.perHost[host]++
		s.mu.Unlock()
		return true
	}
	s.mu.Unlock()
	if ok, unlogged := s.refusals.note(limit, time.Now()); ok {
		flag := map[string]string{"total": "--listener-max-connections", "per_address": "--listener-max-connections-per-address"}[limit]
		s.log.Warn("kafka connection refused: connection limit reached; closing it",
			"limit", limit, "max", value, "open", open, "remote", host, "setting", flag,
			"also_refused_since_last_line", unlogged)
	}
	return false
}

func (s *Server) leave(nc net.Conn) {
	host := remoteHost(nc)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open--
	if s.perHost[host]--; s.perHost[host] <= 0 {
		delete(s.perHost, host)
	}
}

func remoteHost(nc net.Conn) string {
	if h, _, err := net.SplitHostPort(nc.RemoteAddr().String()); err == nil {
		return h
	}
	return nc.RemoteAddr().String()
}

var (
	connectionsDesc = prometheus.NewDesc("relay_listener_connections",
		"Open Kafka client connections.", nil, nil)
	refusedDesc = prometheus.NewDesc("relay_listener_connections_refused_total",
		"Kafka client connections closed at once because a connection limit was reached.", []string{"limit"}, nil)
	authFailuresDesc = prometheus.NewDesc("relay_listener_authentication_failures_total",
		"Failed SASL authentications on the Kafka listener.", nil, nil)
	budgetDesc = prometheus.NewDesc("relay_listener_inflight_budget_bytes",
		"Server-wide budget of request and fetch response bytes in flight (0: unlimited).", nil, nil)
	inflightDesc = prometheus.NewDesc("relay_listener_inflight_bytes",
		"Request and fetch response bytes in flight, held against the budget.", nil, nil)
)

func (s *Server) describeListener(ch chan<- *prometheus.Desc) {
	ch <- connectionsDesc
	ch <- refusedDesc
	ch <- authFailuresDesc
	ch <- budgetDesc
	ch <- inflightDesc
}

func (s *Server) collectListener(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	open := s.open
	s.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(connectionsDesc, prometheus.GaugeValue, float64(open))
	ch <- prometheus.MustNewConstMetric(refusedDesc, prometheus.CounterValue, float64(s.stats.refusedTotal.Load()), "total")
	ch <- prometheus.MustNewConstMetric(refusedDesc, prometheus.CounterValue, float64(s.stats.refusedPerAddress.Load()), "per_address")
	ch <- prometheus.MustNewConstMetric(authFailuresDesc, prometheus.CounterValue, float64(s.stats.authFailures.Load()))
	var total, used int64
	for _, b := range []*budget{s.budget, s.fetchBudget} {
		if b != nil {
			total, used = total+b.total, used+b.used.Load()
		}
	}
	ch <- prometheus.MustNewConstMetric(budgetDesc, prometheus.GaugeValue, float64(total))
	ch <- prometheus.MustNewConstMetric(inflightDesc, prometheus.GaugeValue, float64(used))
}
