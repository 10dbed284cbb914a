package cli

import "sync"

// whileOpen holds what an embedded sink's OnOpen hook made for the open
// broker (the broker itself, a server over it) from the hook until the
// stop it returns, for readers on other goroutines: metrics collectors,
// SIGHUP. The zero value holds nil.
type whileOpen[T any] struct {
	mu sync.Mutex
	v  *T
}

// hold keeps v until release is called.
func (w *whileOpen[T]) hold(v *T) (release func()) {
	w.set(v)
	return func() { w.set(nil) }
}

func (w *whileOpen[T]) set(v *T) {
	w.mu.Lock()
	w.v = v
	w.mu.Unlock()
}

// get is what is held, or nil.
func (w *whileOpen[T]) get() *T {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.v
}
