package wire

// Kind is the kind of a plan, as the engine names it.
type Kind string

// Kinds of plans.
const (
	// KindRound is a round boundary: every job may be re-placed.
	KindRound Kind = "round"
	// KindFill places waiting jobs on idle GPUs between boundaries.
	KindFill Kind = "fill"
	// KindNone is an empty decision: a fill with nothing to do.
	KindNone Kind = "none"
)

// Action is what a decision does to one job, as the engine names it.
type Action string

// Actions.
const (
	ActionStart  Action = "start"  // was waiting, now runs
	ActionKeep   Action = "keep"   // runs on exactly the GPUs it had
	ActionStop   Action = "stop"   // ran, now waits (preempted or evicted)
	ActionMove   Action = "move"   // runs on other GPUs: some units restart
	ActionFork   Action = "fork"   // keeps its units and gains copies (HadarE)
	ActionUnfork Action = "unfork" // keeps some of its units and loses others
	ActionWait   Action = "wait"   // waited and still waits
)

// Reason is the policy's account of one job in a plan: the numbers it
// decided by and one line for a person.
type Reason struct {
	// Share is the fraction of wall time the policy gives the job on
	// each GPU type it considered.
	Share []float64 `json:"share,omitempty"`
	// Priority is Gavel's round priority: share over time received.
	Priority float64 `json:"priority,omitempty"`
	// Price is what Hadar's prices charge for the job's placement this
	// round; Utility is the value of its progress in that round.
	Price   float64 `json:"price,omitempty"`
	Utility float64 `json:"utility,omitempty"`
	// Timer is how long delay scheduling makes the job wait for a tighter
	// placement; Waited how long it has waited (seconds).
	Timer  float64 `json:"timer_s,omitempty"`
	Waited float64 `json:"waited_s,omitempty"`
	// Why says it in one line for a person.
	Why string `json:"why,omitempty"`
}

// Unit is one running instance of a job that a decision places: its GPUs
// node by node. Its keys are capitalised, as the decisions have always
// been written (and the agent's snapshot keeps them).
type Unit struct {
	Slots []Slot `json:"Slots"`
}

// Slot is GPUs of one type on one node of a Unit.
type Slot struct {
	Node  string `json:"Node"`
	Type  string `json:"Type"`
	Count int    `json:"Count"`
}
