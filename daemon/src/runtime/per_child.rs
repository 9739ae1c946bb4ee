//! `max_connections_per_child`: the connections open from inside each child's process tree,
//! counted apart from `max_connections`, so one child (or its escapees) opening connections in
//! a loop takes its own allowance and no more, and editors can still connect.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::registry::Tree;

/// Open connections per child tree (trees with none are not kept).
#[derive(Debug, Default)]
pub(super) struct PerChild {
    open: Mutex<HashMap<Tree, usize>>,
}

/// The tree already has `max_connections_per_child` connections open.
#[derive(Debug)]
pub(super) struct OverLimit;

/// One connection's place in its tree's allowance, given back when it drops.
#[derive(Debug)]
pub(super) struct TreeSlot {
    tree: Tree,
    owner: Arc<PerChild>,
}

impl PerChild {
    /// A place for a connection from `tree`, or `None` when it already has `max` open. A
    /// connection from outside every child takes none (always granted).
    pub(super) fn take(
        self: &Arc<Self>,
        tree: Tree,
        max: usize,
    ) -> Result<Option<TreeSlot>, OverLimit> {
        if tree == Tree::Outside {
            return Ok(None);
        }
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.entry(tree).or_insert(0);
        if *count >= max {
            return Err(OverLimit);
        }
        *count += 1;
        Ok(Some(TreeSlot {
            tree,
            owner: self.clone(),
        }))
    }
}

impl Drop for TreeSlot {
    fn drop(&mut self) {
        let mut open = self.owner.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = open.get_mut(&self.tree) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.tree);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tree_has_its_own_allowance_and_gets_it_back() {
        let per = Arc::new(PerChild::default());
        let a = Tree::Child { pid: 10, start: 1 };
        let b = Tree::Child { pid: 11, start: 1 };
        let held: Vec<_> = (0..2).map(|_| per.take(a, 2).unwrap()).collect();
        assert!(per.take(a, 2).is_err());
        assert!(per.take(b, 2).unwrap().is_some());
        assert!(per.take(Tree::Outside, 2).unwrap().is_none());
        drop(held);
        assert!(per.take(a, 2).is_ok());
        assert!(per.open.lock().unwrap().is_empty());
    }
}
