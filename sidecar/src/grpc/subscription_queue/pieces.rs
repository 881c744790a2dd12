//! A change cut into messages that each fit a subscriber's byte limit
//! (`max_response_bytes`): a change may hold more than one message may (a
//! reload's catch-up sends every item that differs as one change, an etcd
//! transaction or an Apollo release several at once), and daprd delivers
//! it whatever its size. Only one item larger than the limit on its own
//! cannot be delivered.

/// One message's share of a change: its items, in the change's order,
/// and the bytes they take.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Piece<I> {
    /// The items of this message.
    pub(crate) items: Vec<I>,
    /// The bytes they take, as `bytes` counted them.
    pub(crate) bytes: usize,
}

/// An item that alone takes more than a message may.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ItemTooLarge {
    /// Its place in the change.
    pub(crate) index: usize,
    /// The bytes it takes.
    pub(crate) bytes: usize,
}

/// `items` cut, in order, into the fewest consecutive pieces of at most
/// `room` bytes each (`bytes` counting an item's): one piece when they all
/// fit (so a change that fits is one message, as before), none when there
/// are no items.
pub(crate) fn pieces<I>(
    items: Vec<I>,
    room: usize,
    bytes: impl Fn(&I) -> usize,
) -> Result<Vec<Piece<I>>, ItemTooLarge> {
    let mut pieces: Vec<Piece<I>> = Vec::new();
    for (index, item) in items.into_iter().enumerate() {
        let size = bytes(&item);
        if size > room {
            return Err(ItemTooLarge { index, bytes: size });
        }
        match pieces.last_mut() {
            Some(last) if last.bytes + size <= room => {
                last.bytes += size;
                last.items.push(item);
            }
            _ => pieces.push(Piece {
                items: vec![item],
                bytes: size,
            }),
        }
    }
    Ok(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(pieces: &[Piece<usize>]) -> Vec<Vec<usize>> {
        pieces.iter().map(|piece| piece.items.clone()).collect()
    }

    #[test]
    fn items_are_cut_in_order_into_pieces_within_the_room() {
        let cut = pieces(vec![6, 6, 3, 1, 10], 10, |n| *n).expect("every item fits");
        assert_eq!(sizes(&cut), vec![vec![6], vec![6, 3, 1], vec![10]]);
        assert_eq!(
            cut.iter().map(|p| p.bytes).collect::<Vec<_>>(),
            vec![6, 10, 10]
        );
        let whole = pieces(vec![1, 2, 3], 10, |n| *n).expect("fits");
        assert_eq!(
            sizes(&whole),
            vec![vec![1, 2, 3]],
            "a change that fits is one"
        );
        assert!(pieces(Vec::<usize>::new(), 10, |n| *n)
            .expect("nothing")
            .is_empty());
    }

    #[test]
    fn only_an_item_larger_than_the_room_alone_is_refused() {
        assert_eq!(
            pieces(vec![3, 11, 2], 10, |n| *n),
            Err(ItemTooLarge {
                index: 1,
                bytes: 11
            })
        );
    }
}
