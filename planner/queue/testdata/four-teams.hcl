# Four teams sharing v100=36,p100=36,k80=36 (docs/results.md, "Teams on
# one fleet"): a quarter of the fleet guaranteed to each.
queue "flood" {
  guarantee = { v100 = 9, p100 = 9, k80 = 9 }
}

queue "burst-1" {
  guarantee = { v100 = 9, p100 = 9, k80 = 9 }
}

queue "burst-2" {
  guarantee = { v100 = 9, p100 = 9, k80 = 9 }
}

queue "burst-3" {
  guarantee = { v100 = 9, p100 = 9, k80 = 9 }
}
