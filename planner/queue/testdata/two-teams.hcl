# Two teams sharing v100=36,p100=36,k80=36 (docs/results.md, "Teams on one
# fleet"): half the fleet guaranteed to each, the rest lent while idle.
queue "flood" {
  guarantee = { v100 = 18, p100 = 18, k80 = 18 }
}

queue "burst" {
  guarantee = { v100 = 18, p100 = 18, k80 = 18 }
}
